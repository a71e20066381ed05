"""Load `.proto` schema files at run time and build message classes from them.

Vendor formats (bmodel, Caffe, BMNet calibration tables) are protobuf messages; shipping generated `_pb2`
modules would tie npuc to one protoc version, so the schemas are kept as `.proto` text, parsed by
compiler/protoparse.py (the proto2 subset it supports is listed there), and turned into dynamic message classes
here, imports resolved relative to the importing file's folder.
"""

from __future__ import annotations

import types
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from npuc.compiler.errors import UserError
from npuc.compiler.protoparse import ProtoParser, parse_proto


def build_namespace(files: list[descriptor_pb2.FileDescriptorProto], source: str = "<proto>") -> types.SimpleNamespace:
    """Add files (dependencies first) to a fresh pool; return the last file's classes and enums.

    The namespace mirrors a generated `_pb2` module: top-level messages and enums as attributes, nested
    types reachable as attributes of their parent class, enum value names as module constants, and
    `DESCRIPTOR` (the FileDescriptor) and `pool`.
    """
    pool = descriptor_pool.DescriptorPool()
    try:
        for fdp in files:
            pool.Add(fdp)
        file_desc = pool.FindFileByName(files[-1].name)
    except (TypeError, ValueError, KeyError) as exc:
        raise UserError(f"{source}: invalid schema: {exc}; fix the .proto file") from None
    namespace = types.SimpleNamespace(DESCRIPTOR=file_desc, pool=pool)
    for msg_name, msg_desc in file_desc.message_types_by_name.items():
        setattr(namespace, msg_name, message_factory.GetMessageClass(msg_desc))
    for enum_name, enum_desc in file_desc.enum_types_by_name.items():
        setattr(namespace, enum_name, EnumTypeWrapper(enum_desc))
        for value in enum_desc.values:
            setattr(namespace, value.name, value.number)
    return namespace


def _load_files(path: Path, seen: dict[str, descriptor_pb2.FileDescriptorProto], order: list, stack: tuple):
    """Parse `path` and (depth first) the files it imports, relative to its folder."""
    key = str(path.resolve())
    if key in stack:
        raise UserError(f"{path}: import cycle through {' -> '.join(stack + (key,))}; remove the cycle")
    if key in seen:
        return seen[key]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read proto schema {path}: {exc}; check the path") from None
    probe = ProtoParser(text, str(path)).parse_file(path.name)  # first pass: learn the imports
    deps = tuple(_load_files(path.parent / dep, seen, order, stack + (key,)) for dep in probe.dependency)
    fdp = parse_proto(text, path.name, deps)
    fdp.ClearField("dependency")
    fdp.dependency.extend(dep.name for dep in deps)
    seen[key] = fdp
    order.append(fdp)
    return fdp


def load_proto(path: str | Path) -> types.SimpleNamespace:
    """Parse a .proto file (and its imports, relative to its folder) and return its message classes."""
    path = Path(path)
    order: list[descriptor_pb2.FileDescriptorProto] = []
    _load_files(path, {}, order, ())
    return build_namespace(order, str(path))


def load_proto_text(text: str, name: str = "schema.proto") -> types.SimpleNamespace:
    """Like load_proto for schema text without imports."""
    return build_namespace([parse_proto(text, name)], name)
