"""The XSpace protobuf schema (``xplane.proto``), built at run time from its published field numbers.

Why at run time: the schema is small (seven messages) and stable since 2020;
compiling a ``.proto`` needs ``protoc`` at build time, and generated ``_pb2``
code is tied to the protobuf release that generated it (code from a newer
``protoc`` refuses to import on an older runtime). Describing the messages
with :mod:`google.protobuf.descriptor_pb2` and asking
:mod:`google.protobuf.message_factory` for their classes works on every
protobuf release since 4.22 and decodes with its C (upb) parser. The reader walks the XSpace's top
level itself (:mod:`.xplane`, to keep the planes before a cut) and decodes each plane with the ``XPlane``
class (``MessageFactory.GetPrototype`` stands in for ``GetMessageClass`` on releases without it). The field
numbers are those of ``tsl/profiler/protobuf/xplane.proto`` (package
``tensorflow.profiler``; the same file in openxla/xla and tensorflow):

* ``XSpace``: planes 1, errors 2, warnings 3, hostnames 4
* ``XPlane``: id 1, name 2, lines 3, event_metadata 4 (map int64 → XEventMetadata), stat_metadata 5 (map int64 →
  XStatMetadata), stats 6
* ``XLine``: id 1, name 2, timestamp_ns 3, events 4, duration_ps 9, display_id 10, display_name 11
* ``XEvent``: metadata_id 1, offset_ps 2 | num_occurrences 5 (oneof data), duration_ps 3, stats 4
* ``XStat``: metadata_id 1, double_value 2 | uint64_value 3 | int64_value 4 | str_value 5 | bytes_value 6 |
  ref_value 7 (oneof value; ref_value: the value is the name of that stat metadata)
* ``XEventMetadata``: id 1, name 2, metadata 3, display_name 4, stats 5, child_id 6
* ``XStatMetadata``: id 1, name 2, description 3
"""

from __future__ import annotations

from functools import lru_cache

#: (message, [(field, number, type, label, message type or None, oneof index or None)]); types and labels by name.
_MESSAGES = {
    "XSpace": [("planes", 1, "message", "repeated", "XPlane", None), ("errors", 2, "string", "repeated", None, None),
               ("warnings", 3, "string", "repeated", None, None), ("hostnames", 4, "string", "repeated", None, None)],
    "XPlane": [("id", 1, "int64", "optional", None, None), ("name", 2, "string", "optional", None, None),
               ("lines", 3, "message", "repeated", "XLine", None),
               ("event_metadata", 4, "message", "repeated", "XPlane.EventMetadataEntry", None),
               ("stat_metadata", 5, "message", "repeated", "XPlane.StatMetadataEntry", None),
               ("stats", 6, "message", "repeated", "XStat", None)],
    "XLine": [("id", 1, "int64", "optional", None, None), ("name", 2, "string", "optional", None, None),
              ("timestamp_ns", 3, "int64", "optional", None, None),
              ("events", 4, "message", "repeated", "XEvent", None),
              ("duration_ps", 9, "int64", "optional", None, None), ("display_id", 10, "int64", "optional", None, None),
              ("display_name", 11, "string", "optional", None, None)],
    "XEvent": [("metadata_id", 1, "int64", "optional", None, None),
               ("offset_ps", 2, "int64", "optional", None, 0),
               ("num_occurrences", 5, "int64", "optional", None, 0),
               ("duration_ps", 3, "int64", "optional", None, None),
               ("stats", 4, "message", "repeated", "XStat", None)],
    "XStat": [("metadata_id", 1, "int64", "optional", None, None), ("double_value", 2, "double", "optional", None, 0),
              ("uint64_value", 3, "uint64", "optional", None, 0), ("int64_value", 4, "int64", "optional", None, 0),
              ("str_value", 5, "string", "optional", None, 0), ("bytes_value", 6, "bytes", "optional", None, 0),
              ("ref_value", 7, "uint64", "optional", None, 0)],
    "XEventMetadata": [("id", 1, "int64", "optional", None, None), ("name", 2, "string", "optional", None, None),
                       ("metadata", 3, "bytes", "optional", None, None),
                       ("display_name", 4, "string", "optional", None, None),
                       ("stats", 5, "message", "repeated", "XStat", None),
                       ("child_id", 6, "int64", "repeated", None, None)],
    "XStatMetadata": [("id", 1, "int64", "optional", None, None), ("name", 2, "string", "optional", None, None),
                      ("description", 3, "string", "optional", None, None)],
}
#: The oneof of the messages that have one.
_ONEOFS = {"XEvent": "data", "XStat": "value"}
#: The two map fields, as protobuf describes a map: a nested ``...Entry`` message with key 1 and value 2.
_MAP_ENTRIES = {"XPlane": [("EventMetadataEntry", "XEventMetadata"), ("StatMetadataEntry", "XStatMetadata")]}
PACKAGE = "tensorflow.profiler"


def message_class(name: str):
    """The message class ``name`` (``XSpace``, ``XPlane``, ...) of the schema."""
    return _classes()[name]


@lru_cache(maxsize=1)
def _classes() -> dict:
    """{message name: class} (protobuf imported here, so the reader loads without it)."""
    return build_classes("traceparse_xplane.proto", PACKAGE, _MESSAGES, _ONEOFS, _MAP_ENTRIES)


def build_classes(filename: str, package: str, messages: dict, oneofs: dict | None = None,
                  map_entries: dict | None = None) -> dict:
    """{message name: class} of a proto3 schema given as field tables (the form of :data:`_MESSAGES`).

    Shared with :mod:`.hlo_schema`. A field's type is one of ``message``, ``string``, ``bytes``, ``int64``,
    ``uint64``, ``int32``, ``bool``, ``double`` (an enum is read as ``int32``: the same varint on the wire);
    ``oneofs`` names the one oneof of a message, ``map_entries`` its map fields (key int64).
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    types = {"message": F.TYPE_MESSAGE, "string": F.TYPE_STRING, "int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64,
             "int32": F.TYPE_INT32, "bool": F.TYPE_BOOL, "double": F.TYPE_DOUBLE, "bytes": F.TYPE_BYTES}
    labels = {"optional": F.LABEL_OPTIONAL, "repeated": F.LABEL_REPEATED}
    file = descriptor_pb2.FileDescriptorProto(name=filename, package=package, syntax="proto3")
    oneofs, map_entries = oneofs or {}, map_entries or {}

    def add_field(message, name, number, type_, label, type_name, oneof):
        field = message.field.add(name=name, number=number, type=types[type_], label=labels[label])
        if type_name:
            field.type_name = f".{package}.{type_name}"
        if oneof is not None:
            field.oneof_index = oneof

    for name, fields in messages.items():
        message = file.message_type.add(name=name)
        if name in oneofs:
            message.oneof_decl.add(name=oneofs[name])
        for entry, value in map_entries.get(name, []):
            nested = message.nested_type.add(name=entry)
            nested.options.map_entry = True
            add_field(nested, "key", 1, "int64", "optional", None, None)
            add_field(nested, "value", 2, "message", "optional", value, None)
        for field in fields:
            add_field(message, *field)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    get = getattr(message_factory, "GetMessageClass", None) or message_factory.MessageFactory(pool).GetPrototype
    return {name: get(pool.FindMessageTypeByName(f"{package}.{name}")) for name in messages}
