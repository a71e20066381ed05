"""Parse .proto text (a proto2 subset) into a FileDescriptorProto: the tokenizer, the parser and the resolution
of relative type names; compiler/protoschema.py turns the result into message classes.

Supported: syntax/package/import/option statements, messages (nested), enums, optional/required/repeated fields
of scalar, string, bytes, message and enum types, `map<K, V>`, `oneof`, field options `default`, `packed`,
`deprecated`, `json_name`; `reserved`/`extensions` are accepted. Groups, services and `extend` blocks are
rejected with a clear error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from google.protobuf import descriptor_pb2, text_encoding

from npuc.compiler.errors import UserError

_FDP = descriptor_pb2.FieldDescriptorProto

SCALAR_TYPES: dict[str, int] = {
    "double": _FDP.TYPE_DOUBLE,
    "float": _FDP.TYPE_FLOAT,
    "int32": _FDP.TYPE_INT32,
    "int64": _FDP.TYPE_INT64,
    "uint32": _FDP.TYPE_UINT32,
    "uint64": _FDP.TYPE_UINT64,
    "sint32": _FDP.TYPE_SINT32,
    "sint64": _FDP.TYPE_SINT64,
    "fixed32": _FDP.TYPE_FIXED32,
    "fixed64": _FDP.TYPE_FIXED64,
    "sfixed32": _FDP.TYPE_SFIXED32,
    "sfixed64": _FDP.TYPE_SFIXED64,
    "bool": _FDP.TYPE_BOOL,
    "string": _FDP.TYPE_STRING,
    "bytes": _FDP.TYPE_BYTES,
}
_LABELS = {
    "optional": _FDP.LABEL_OPTIONAL,
    "required": _FDP.LABEL_REQUIRED,
    "repeated": _FDP.LABEL_REPEATED,
}
_INT_TYPES = {"int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64"}
_INT_TYPES |= {"sfixed32", "sfixed64"}
_MAX_FIELD_NUMBER = (1 << 29) - 1

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>-?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))
  | (?P<ident>\.?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<symbol>[{}\[\]()<>=;,:.+-])
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True)
class Token:
    kind: str  # "string" | "number" | "ident" | "symbol" | "eof"
    text: str
    line: int
    col: int


def tokenize(text: str, source: str = "<proto>") -> list[Token]:
    """Split proto text into tokens, dropping whitespace and comments."""
    tokens: list[Token] = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise UserError(
                f"{source}:{line}:{pos - line_start + 1}: unexpected character {text[pos]!r} in .proto; "
                "fix the schema syntax"
            )
        kind = m.lastgroup or ""
        if kind not in ("ws", "comment"):
            tokens.append(Token(kind, m.group(), line, pos - line_start + 1))
        newlines = m.group().count("\n")
        if newlines:
            line += newlines
            line_start = m.start() + m.group().rfind("\n") + 1
        pos = m.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens


def _unescape(literal: str) -> bytes:
    """Decode a quoted proto string literal (C escapes) into bytes."""
    return text_encoding.CUnescape(literal[1:-1])


class ProtoParser:
    """Recursive-descent parser producing a FileDescriptorProto (type names resolved afterwards)."""

    def __init__(self, text: str, source: str) -> None:
        self.tokens = tokenize(text, source)
        self.pos = 0
        self.source = source

    # -- token helpers -------------------------------------------------------------------------------
    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def error(self, what: str, tok: Token | None = None) -> UserError:
        tok = tok or self.peek()
        got = tok.text or "end of file"
        return UserError(f"{self.source}:{tok.line}:{tok.col}: {what} (got {got!r}); fix the .proto schema")

    def next(self) -> Token:
        tok = self.peek()
        if tok.kind != "eof":
            self.pos += 1
        return tok

    def accept(self, text: str) -> bool:
        if self.peek().text == text and self.peek().kind != "string":
            self.pos += 1
            return True
        return False

    def expect(self, text: str) -> Token:
        if not self.accept(text):
            raise self.error(f"expected {text!r}")
        return self.tokens[self.pos - 1]

    def ident(self, what: str = "identifier") -> str:
        tok = self.peek()
        if tok.kind != "ident":
            raise self.error(f"expected {what}")
        self.pos += 1
        return tok.text

    def integer(self) -> int:
        tok = self.next()
        if tok.kind != "number":
            raise self.error("expected an integer", tok)
        try:
            return int(tok.text, 0) if not re.fullmatch(r"-?0\d+", tok.text) else int(tok.text, 8)
        except ValueError:
            raise self.error("expected an integer", tok) from None

    def constant(self) -> Token:
        """A constant: number, string (adjacent literals concatenated), identifier, or signed inf/nan."""
        tok = self.next()
        if tok.kind == "symbol" and tok.text in "+-" and self.peek().kind == "ident":
            name = self.next().text
            return Token("ident", ("-" if tok.text == "-" else "") + name, tok.line, tok.col)
        if tok.kind == "string":
            parts = [tok.text[1:-1]]
            while self.peek().kind == "string":
                parts.append(self.next().text[1:-1])
            return Token("string", '"' + "".join(parts) + '"', tok.line, tok.col)
        if tok.kind in ("number", "ident"):
            return tok
        raise self.error("expected a constant", tok)

    def skip_option_value(self) -> None:
        """Skip an option value, including aggregate `{ ... }` text-format values."""
        if self.peek().text == "{":
            depth = 0
            while True:
                tok = self.next()
                if tok.kind == "eof":
                    raise self.error("unterminated option value")
                depth += {"{": 1, "}": -1}.get(tok.text, 0) if tok.kind == "symbol" else 0
                if depth == 0:
                    return
        self.constant()

    def option_name(self) -> str:
        if self.accept("("):
            name = "(" + self.ident("option name") + ")"
            self.expect(")")
        else:
            name = self.ident("option name")
        while self.peek().kind == "ident" and self.peek().text.startswith("."):
            name += self.next().text
        return name

    # -- file level ----------------------------------------------------------------------------------
    def parse_file(self, name: str) -> descriptor_pb2.FileDescriptorProto:
        fdp = descriptor_pb2.FileDescriptorProto(name=name, syntax="proto2")
        while self.peek().kind != "eof":
            tok = self.peek()
            if self.accept(";"):
                continue
            if self.accept("syntax"):
                self.expect("=")
                syntax = self.constant()
                value = _unescape(syntax.text).decode() if syntax.kind == "string" else ""
                if value not in ("proto2", "proto3"):
                    raise self.error('syntax must be "proto2" or "proto3"', syntax)
                fdp.syntax = value
                self.expect(";")
            elif self.accept("package"):
                fdp.package = self.ident("package name")
                self.expect(";")
            elif self.accept("import"):
                if self.peek().text in ("public", "weak"):
                    self.next()
                path = self.next()
                if path.kind != "string":
                    raise self.error("expected an import path string", path)
                fdp.dependency.append(_unescape(path.text).decode())
                self.expect(";")
            elif self.accept("option"):
                self.option_name()
                self.expect("=")
                self.skip_option_value()
                self.expect(";")
            elif self.accept("message"):
                self.parse_message(fdp.message_type.add(), fdp.syntax)
            elif self.accept("enum"):
                self.parse_enum(fdp.enum_type.add())
            elif tok.text in ("service", "extend"):
                raise self.error(f"'{tok.text}' blocks are not supported")
            else:
                raise self.error("expected a top-level declaration")
        return fdp

    def parse_enum(self, enum: descriptor_pb2.EnumDescriptorProto) -> None:
        enum.name = self.ident("enum name")
        self.expect("{")
        while not self.accept("}"):
            if self.accept(";"):
                continue
            if self.accept("option"):
                name = self.option_name()
                self.expect("=")
                value = self.constant()
                if name == "allow_alias":
                    enum.options.allow_alias = value.text == "true"
                self.expect(";")
            elif self.accept("reserved"):
                self.skip_statement()
            else:
                value = enum.value.add(name=self.ident("enum value name"))
                self.expect("=")
                value.number = self.integer()
                if self.accept("["):
                    self.parse_options(lambda *_: None)
                self.expect(";")
        if not enum.value:
            raise self.error(f"enum {enum.name} has no values")

    def skip_statement(self) -> None:
        while not self.accept(";"):
            if self.next().kind == "eof":
                raise self.error("expected ';'")

    def parse_message(self, msg: descriptor_pb2.DescriptorProto, syntax: str) -> None:
        msg.name = self.ident("message name")
        self.expect("{")
        self.parse_message_body(msg, syntax)

    def parse_message_body(
        self, msg: descriptor_pb2.DescriptorProto, syntax: str, oneof_index: int | None = None
    ) -> None:
        while not self.accept("}"):
            tok = self.peek()
            if tok.kind == "eof":
                raise self.error(f"message {msg.name} is missing its closing '}}'")
            if self.accept(";"):
                continue
            if oneof_index is None and self.accept("message"):
                self.parse_message(msg.nested_type.add(), syntax)
            elif oneof_index is None and self.accept("enum"):
                self.parse_enum(msg.enum_type.add())
            elif self.accept("option"):
                self.option_name()
                self.expect("=")
                self.skip_option_value()
                self.expect(";")
            elif oneof_index is None and tok.text in ("reserved", "extensions"):
                self.next()
                self.skip_statement()
            elif oneof_index is None and self.accept("oneof"):
                msg.oneof_decl.add(name=self.ident("oneof name"))
                self.expect("{")
                self.parse_message_body(msg, syntax, len(msg.oneof_decl) - 1)
            elif tok.text in ("group", "extend") or (self.peek(1).text == "group"):
                raise self.error("groups and extend blocks are not supported")
            elif tok.text == "map" and self.peek(1).text == "<":
                self.parse_map_field(msg)
            else:
                self.parse_field(msg, syntax, oneof_index)

    def parse_field(self, msg: descriptor_pb2.DescriptorProto, syntax: str, oneof_index: int | None) -> None:
        field = msg.field.add()
        label_tok = self.peek()
        if label_tok.text in _LABELS and self.peek(1).kind == "ident" and self.peek(2).text != "=":
            self.next()
            field.label = _LABELS[label_tok.text]
            if label_tok.text == "optional" and syntax == "proto3":
                field.proto3_optional = True
        elif syntax == "proto3" or oneof_index is not None:
            field.label = _FDP.LABEL_OPTIONAL
        else:
            raise self.error("expected a field label (optional, required or repeated)")
        type_name = self.ident("field type")
        field.name = self.ident("field name")
        self.expect("=")
        number_tok = self.peek()
        field.number = self.integer()
        if not 1 <= field.number <= _MAX_FIELD_NUMBER:
            raise self.error(f"field number of {msg.name}.{field.name} out of range", number_tok)
        if type_name in SCALAR_TYPES:
            field.type = SCALAR_TYPES[type_name]
        else:
            field.type_name = type_name  # resolved later to a message or enum
        if oneof_index is not None:
            field.oneof_index = oneof_index
        if self.accept("["):
            self.parse_options(lambda name, value: self.apply_field_option(field, type_name, name, value))
        self.expect(";")

    def parse_map_field(self, msg: descriptor_pb2.DescriptorProto) -> None:
        self.expect("map")
        self.expect("<")
        key_type = self.ident("map key type")
        self.expect(",")
        value_type = self.ident("map value type")
        self.expect(">")
        name = self.ident("field name")
        self.expect("=")
        number = self.integer()
        if self.accept("["):
            self.parse_options(lambda *_: None)
        self.expect(";")
        entry_name = "".join(part[:1].upper() + part[1:] for part in name.split("_")) + "Entry"
        entry = msg.nested_type.add(name=entry_name)
        entry.options.map_entry = True
        for index, (field_name, type_name) in enumerate((("key", key_type), ("value", value_type)), 1):
            sub = entry.field.add(name=field_name, number=index, label=_FDP.LABEL_OPTIONAL)
            if type_name in SCALAR_TYPES:
                sub.type = SCALAR_TYPES[type_name]
            else:
                sub.type_name = type_name
        msg.field.add(name=name, number=number, label=_FDP.LABEL_REPEATED, type_name=entry_name)

    def parse_options(self, apply) -> None:
        while True:
            name = self.option_name()
            self.expect("=")
            value = self.constant()
            apply(name, value)
            if self.accept("]"):
                return
            self.expect(",")

    def apply_field_option(self, field: _FDP, type_name: str, name: str, value: Token) -> None:
        if name == "default":
            field.default_value = self.default_text(type_name, value)
        elif name == "packed":
            field.options.packed = value.text == "true"
        elif name == "deprecated":
            field.options.deprecated = value.text == "true"
        elif name == "json_name":
            field.json_name = _unescape(value.text).decode() if value.kind == "string" else value.text
        # other (custom) options do not change the wire format; ignore them

    def default_text(self, type_name: str, value: Token) -> str:
        """Render a `[default = ...]` constant in FieldDescriptorProto.default_value's text form."""
        if type_name in ("string", "bytes"):
            if value.kind != "string":
                raise self.error(f"default of a {type_name} field must be a string literal", value)
            raw = _unescape(value.text)
            return raw.decode("utf-8") if type_name == "string" else text_encoding.CEscape(raw, False)
        if type_name == "bool":
            if value.text not in ("true", "false"):
                raise self.error("default of a bool field must be true or false", value)
            return value.text
        if type_name in _INT_TYPES:
            if value.kind != "number":
                raise self.error(f"default of a {type_name} field must be an integer", value)
            try:
                return str(int(value.text, 0) if not re.fullmatch(r"-?0\d+", value.text) else int(value.text, 8))
            except ValueError:
                raise self.error(f"default of a {type_name} field must be an integer", value) from None
        if type_name in ("float", "double"):
            if value.kind == "number" or value.text.lstrip("-") in ("inf", "nan"):
                return value.text if not value.text.lower().startswith(("0x", "-0x")) else str(int(value.text, 0))
            raise self.error(f"default of a {type_name} field must be a number", value)
        if value.kind != "ident":
            raise self.error("default of an enum field must be one of its value names", value)
        return value.text  # enum value name, checked by the descriptor pool


def _resolve_types(fdp: descriptor_pb2.FileDescriptorProto, known: dict[str, int], source: str) -> None:
    """Replace relative type names by fully qualified ones (innermost scope first, as protoc does)."""

    def resolve(name: str, scope: str, where: str) -> tuple[str, int]:
        if name.startswith("."):
            candidates = [name[1:]]
        else:
            parts = scope.split(".") if scope else []
            candidates = [".".join(parts[:i] + [name]) for i in range(len(parts), -1, -1)]
        for full in candidates:
            if full in known:
                return "." + full, known[full]
        raise UserError(f"{source}: unknown type {name!r} in {where}; define or import it")

    def visit(msg: descriptor_pb2.DescriptorProto, scope: str) -> None:
        full = f"{scope}.{msg.name}" if scope else msg.name
        for field in msg.field:
            if field.type_name:
                field.type_name, field.type = resolve(field.type_name, full, f"{full}.{field.name}")
        for nested in msg.nested_type:
            visit(nested, full)

    for msg in fdp.message_type:
        visit(msg, fdp.package)


def _collect_names(fdp: descriptor_pb2.FileDescriptorProto) -> dict[str, int]:
    known: dict[str, int] = {}

    def visit_enum(enum: descriptor_pb2.EnumDescriptorProto, scope: str) -> None:
        known[f"{scope}.{enum.name}" if scope else enum.name] = _FDP.TYPE_ENUM

    def visit(msg: descriptor_pb2.DescriptorProto, scope: str) -> None:
        full = f"{scope}.{msg.name}" if scope else msg.name
        known[full] = _FDP.TYPE_MESSAGE
        for nested in msg.nested_type:
            visit(nested, full)
        for enum in msg.enum_type:
            visit_enum(enum, full)

    for msg in fdp.message_type:
        visit(msg, fdp.package)
    for enum in fdp.enum_type:
        visit_enum(enum, fdp.package)
    return known


def parse_proto(
    text: str,
    name: str = "schema.proto",
    dependencies: tuple[descriptor_pb2.FileDescriptorProto, ...] = (),
) -> descriptor_pb2.FileDescriptorProto:
    """Parse .proto text into a FileDescriptorProto; `dependencies` supply types of imported files."""
    fdp = ProtoParser(text, name).parse_file(name)
    known: dict[str, int] = {}
    for dep in dependencies:
        known.update(_collect_names(dep))
    known.update(_collect_names(fdp))
    _resolve_types(fdp, known, name)
    return fdp
