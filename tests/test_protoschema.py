"""Tests for compiler/protoschema.py: .proto text -> FileDescriptorProto -> dynamic message classes."""

from __future__ import annotations

import math

import pytest
from google.protobuf import descriptor_pb2, text_format

from npuc.compiler.errors import UserError
from npuc.compiler.protoparse import parse_proto, tokenize
from npuc.compiler.protoschema import load_proto, load_proto_text

SCHEMA = r"""
syntax = "proto2";
package demo.x;
option java_package = "x.y";
// a line comment
message Outer {
  enum Kind { A = 0; B = 1; }
  message Inner {
    optional int32 v = 1 [default = -3];
    repeated float f = 2 [packed = true];
    repeated int32 unpacked = 3;
  }
  optional Kind kind = 1 [default = B];
  repeated Inner inner = 2;
  optional string s = 3 [default = "hi\n\"x\""];
  optional bytes b = 4 [default = "\001\377"];
  optional float fl = 5 [default = -inf];
  optional double d = 6 [default = 1e-5];
  required uint64 u = 7 [default = 0x10];
  optional bool t = 8 [default = true, deprecated = true];
  map<string, int32> m = 9;
  oneof o { int32 oa = 10; string ob = 11; }
  optional Top top = 12;
  optional .demo.x.Outer.Inner abs_inner = 13;
  reserved 20 to 25;
  extensions 100 to max;
  /* block
     comment */
}
enum Top { T0 = 0; T1 = 5; }
"""


@pytest.fixture(scope="module")
def ns():
    return load_proto_text(SCHEMA, "demo.proto")


def test_descriptor_fields_and_resolution():
    fdp = parse_proto(SCHEMA, "demo.proto")
    assert isinstance(fdp, descriptor_pb2.FileDescriptorProto)
    assert fdp.package == "demo.x" and fdp.syntax == "proto2"
    outer = fdp.message_type[0]
    fields = {f.name: f for f in outer.field}
    assert fields["kind"].type_name == ".demo.x.Outer.Kind"
    assert fields["kind"].type == descriptor_pb2.FieldDescriptorProto.TYPE_ENUM
    assert fields["inner"].type_name == ".demo.x.Outer.Inner"
    assert fields["inner"].label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    assert fields["top"].type_name == ".demo.x.Top"
    assert fields["abs_inner"].type_name == ".demo.x.Outer.Inner"
    assert fields["u"].label == descriptor_pb2.FieldDescriptorProto.LABEL_REQUIRED
    assert fields["u"].default_value == "16"
    assert fields["b"].default_value == r"\001\377"
    assert fields["oa"].oneof_index == 0 and fields["ob"].oneof_index == 0
    assert [n.name for n in outer.nested_type] == ["Inner", "MEntry"]
    assert outer.nested_type[1].options.map_entry
    assert outer.nested_type[0].field[1].options.packed


def test_defaults(ns):
    msg = ns.Outer()
    assert msg.kind == 1 and msg.s == 'hi\n"x"' and msg.b == b"\x01\xff"
    assert msg.fl == -math.inf and msg.d == 1e-5 and msg.u == 16 and msg.t is True
    assert ns.Outer.Inner().v == -3
    assert ns.Top.Value("T1") == 5 and ns.Top.Name(0) == "T0" and ns.T1 == 5


def test_wire_format_packed_and_roundtrip(ns):
    msg = ns.Outer(u=1)
    msg.inner.add(f=[1.0, 2.0], unpacked=[7, 8])
    raw = msg.SerializeToString()
    # field 2 (inner, LEN 22): packed floats as one LEN record (0x12 0x08), unpacked ints as 2 varints
    assert raw.hex() == "120e" + "1208" + "0000803f00000040" + "1807" + "1808" + "3801"
    assert ns.Outer.FromString(raw) == msg


def test_text_format(ns):
    msg = text_format.Parse('u: 3 kind: A inner { v: 4 f: 1.5 } m { key: "k" value: 9 } top: T1 ob: "z"', ns.Outer())
    assert msg.u == 3 and msg.kind == 0 and msg.inner[0].v == 4 and list(msg.inner[0].f) == [1.5]
    assert dict(msg.m) == {"k": 9} and msg.top == 5 and msg.WhichOneof("o") == "ob"
    again = text_format.Parse(text_format.MessageToString(msg), ns.Outer())
    assert again == msg


def test_required_field_checked(ns):
    with pytest.raises(Exception, match="u"):
        ns.Outer().SerializeToString()


def test_imports(tmp_path):
    (tmp_path / "base.proto").write_text("package b; message Shape { repeated uint32 dim = 1 [packed=true]; }")
    (tmp_path / "top.proto").write_text(
        'import "base.proto"; package t; message Blob { optional b.Shape shape = 1; optional string n = 2; }'
    )
    ns = load_proto(tmp_path / "top.proto")
    blob = ns.Blob(n="x")
    blob.shape.dim.extend([1, 3, 12])
    assert blob.SerializeToString().hex() == "0a05" + "0a0301030c" + "120178"


def test_tokenize_positions():
    toks = tokenize("message A {\n  optional int32 x = 1; // c\n}")
    assert [(t.text, t.line, t.col) for t in toks[3:6]] == [
        ("optional", 2, 3),
        ("int32", 2, 12),
        ("x", 2, 18),
    ]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("message A { optional Missing m = 1; }", "unknown type 'Missing'"),
        ("message A { optional int32 x = 1 }", "expected ';'"),
        ("message A { int32 x = 1; }", "field label"),
        ("message A { optional int32 x = 0; }", "out of range"),
        ('message A { optional int32 x = 1 [default = "s"]; }', "must be an integer"),
        ("message A { optional int32 x = 1; optional int32 y = 1; }", "invalid schema"),
        ("message A { optional group G = 1 { } }", "groups"),
        ("service S {}", "not supported"),
        ("message A { optional int32 x = 1; ", "closing"),
        ("message A { optional int32 x = 1; } @", "unexpected character"),
    ],
)
def test_errors_are_user_errors(text, fragment):
    with pytest.raises(UserError, match=fragment):
        load_proto_text(text, "bad.proto")


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        load_proto(tmp_path / "nope.proto")
