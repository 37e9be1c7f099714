"""Reading the protobuf wire format without decoding a message.

A request of 60,000 nodes fits in the 4 MiB a message may take, and decoding it costs the event
loop about half a second, only for the domain to refuse anything above 1000 nodes. So the
elements of a capped repeated field are counted on the top level of the raw bytes first: each
element of a repeated message field is one length-delimited record with the field's number, so
the count is exact. Counting stops one past the cap, and the records' contents are skipped by
their length, never read.
"""

from __future__ import annotations

_VARINT = 0
_FIXED64 = 1
_LENGTH_DELIMITED = 2
_FIXED32 = 5
_MAX_VARINT_BYTES = 10


class _Malformed(Exception):
    """The bytes are not a message; the decoder says so precisely."""


def _varint(raw: bytes, position: int) -> tuple[int, int]:
    value = 0
    for index in range(_MAX_VARINT_BYTES):
        if position + index >= len(raw):
            break
        byte = raw[position + index]
        value |= (byte & 0x7F) << (7 * index)
        if byte < 0x80:  # noqa: PLR2004 - the continuation bit
            return value, position + index + 1
    raise _Malformed


def more_records_than(raw: bytes, field_number: int, limit: int) -> bool:
    """Whether the top level of ``raw`` holds more than ``limit`` length-delimited records of
    ``field_number``, i.e. a repeated message field with more than ``limit`` elements. Counting
    stops at the first record past the limit. Bytes that stop being a message before then answer
    False: decoding them fails with its own, precise error."""
    seen = 0
    position = 0
    end = len(raw)
    try:
        while position < end:
            key, position = _varint(raw, position)
            number, wire_type = key >> 3, key & 0x7
            if wire_type == _VARINT:
                _, position = _varint(raw, position)
            elif wire_type == _FIXED64:
                position += 8
            elif wire_type == _FIXED32:
                position += 4
            elif wire_type == _LENGTH_DELIMITED:
                length, position = _varint(raw, position)
                position += length
                if number == field_number:
                    seen += 1
                    if seen > limit:
                        return position <= end
            else:
                return False  # groups (deprecated) or no wire type at all
    except _Malformed:
        return False
    return False
