"""What a handler returns: an answer serialised once, and the status a refusal sets.

grpc.aio sends whatever a handler returns through the method's response serializer, which
calls ``SerializeToString``: a ``Serialized`` gives its stored bytes back. A refusal is answered
by setting its status on the call and returning ``NO_MESSAGE`` (grpc.aio sends the status and
discards the message): an ``abort`` raises through every layer of the handler and grpc.aio, and
costs more than the answer of the cheapest read.
"""

from __future__ import annotations

from typing import Any

import grpc


class Serialized:
    """An answer serialised once and sent as is, as many times as it stays true."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # the name protobuf messages answer to
        return self.data


NO_MESSAGE = Serialized(b"")  # beside a non-OK status; grpc.aio never serialises it


def refuse(context: Any, code: grpc.StatusCode, details: str) -> Serialized:
    """Set a refusal's status on the call; the handler returns what this returns."""
    context.set_code(code)
    context.set_details(details)
    return NO_MESSAGE
