"""The protobuf wire format, read without protobuf: what the SentencePiece and ONNX readers need.

Messages are walked field by field; nested messages are the length-delimited values, walked again.
Works on `bytes` or a `memoryview` (no copies of nested messages).
"""

from __future__ import annotations


def varint(buf, i: int) -> tuple[int, int]:
    """(value, next position) of the varint at `i`."""
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, i
        shift += 7


def fields(buf):
    """(field number, wire type, value) of one message, top level only: ints for varints,
    slices of `buf` for the rest. Raises ValueError on a wire type we do not read or a
    truncated message."""
    i, n = 0, len(buf)
    while i < n:
        key, i = varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, i = varint(buf, i)
        elif wire == 1:
            val, i = buf[i: i + 8], i + 8
        elif wire == 2:
            size, i = varint(buf, i)
            val, i = buf[i: i + size], i + size
        elif wire == 5:
            val, i = buf[i: i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if i > n:
            raise ValueError("truncated protobuf message")
        yield num, wire, val
