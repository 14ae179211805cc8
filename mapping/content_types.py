"""The OTLP media types the decoders take, apart from them so that a module that only routes a request by its
type (the C walk in a decode worker) does not import the protobuf classes."""

PROTOBUF_TYPES = frozenset({"application/x-protobuf", "application/protobuf"})
JSON_TYPES = frozenset({"application/json"})


def media_type(content_type: str) -> str:
    """The HTTP Content-Type without its parameters, lower-cased."""
    return content_type.split(";", 1)[0].strip().lower()
