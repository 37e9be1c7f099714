"""The bare limit: a grpc.aio server with nothing but canned answers.

``python -m osas.bench.bare --answers FILE --cert C --key K --client-ca CA`` serves the
CloudProvider methods over the same mTLS as osas (client certificates required), each answering
the bytes osas answered it (a JSON object: method name to base64, or null for UNIMPLEMENTED),
without decoding the request. It prints its port as one JSON line and stops when its standard
input closes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"

Answer = Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[bytes]]


def _answer(data: bytes | None) -> Answer:
    async def answer(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        del request  # never decoded: the bare limit
        if data is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not implemented")
        return data or b""

    return answer


async def serve(args: argparse.Namespace) -> None:
    answers: dict[str, str | None] = json.loads(Path(args.answers).read_text())
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            _answer(None if data is None else base64.b64decode(data)),
            request_deserializer=None,
            response_serializer=None,
        )
        for name, data in answers.items()
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    credentials = grpc.ssl_server_credentials(
        [(Path(args.key).read_bytes(), Path(args.cert).read_bytes())],
        root_certificates=Path(args.client_ca).read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    sys.stdout.write(json.dumps({"port": port}) + "\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--answers", "--cert", "--key", "--client-ca"):
        parser.add_argument(name, required=True)
    asyncio.run(serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
