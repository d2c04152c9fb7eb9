"""ASGI middleware of the ingress: request-header limit, bearer token, request-body limit, security headers.

Each wraps the FastAPI app as plain ASGI, so it acts before routing and before any
handler reads the body; rejections are JSON ``{"detail": ...}`` like the routes' errors.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence
from typing import Any

from pipeline.serve.options import PUBLIC_PATHS


def app_path(scope: dict[str, Any]) -> str:
    """Request path relative to the app's route prefix."""
    path = scope.get("path", "")
    root = scope.get("root_path", "") or ""
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


async def send_json(send: Any, status: int, body: dict[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """Answer a request with a JSON body straight from ASGI."""
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": data})


class HeaderLimit:
    """Requests whose headers together exceed ``max_bytes`` get 431, before anything else runs
    (the token check included): a 50 MB header must cost nothing past this point."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            size = 0
            for name, value in scope.get("headers", []):
                size += len(name) + len(value) + 4  # "name: value\r\n", as on the wire
                if size > self.max_bytes:
                    await send_json(send, 431, {"detail": f"request headers larger than {self.max_bytes} bytes"})
                    return
        await self.app(scope, receive, send)


class BearerAuth:
    """Every path except :data:`~pipeline.serve.options.PUBLIC_PATHS` needs ``Authorization: Bearer <token>``.

    Protects by default (the report files and any path added later included), compares
    in constant time; no token configured means no check.
    """

    def __init__(self, app: Any, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.token and app_path(scope) not in PUBLIC_PATHS:
            header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
            scheme, _, credentials = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(), self.token):
                await send_json(
                    send, 401, {"detail": "missing or wrong bearer token"}, [(b"www-authenticate", b'Bearer realm="cnsbench"')]
                )
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Request bodies over ``max_bytes`` get 413 before any handler runs.

    Checks the declared Content-Length first, then counts what actually arrives (chunked
    bodies declare none); the body is small by construction, so it is buffered and
    replayed to the app.  Starlette's ``RequestBodyLimitMiddleware`` does not give the same
    answer (plain text, after the handler started, nothing for an invalid length), so this
    one stays (docs/safety.md; ``tests/test_body_limit.py`` measures both).
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _too_large(self, send: Any) -> None:
        await send_json(send, 413, {"detail": f"request body larger than {self.max_bytes} bytes"})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if declared is not None:
            try:
                if int(declared) > self.max_bytes:
                    await self._too_large(send)
                    return
            except ValueError:
                await send_json(send, 400, {"detail": "invalid Content-Length"})
                return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # client went away; the app sees the disconnect on its own receive
            body.extend(message.get("body", b""))
            if len(body) > self.max_bytes:
                await self._too_large(send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class SecurityHeaders:
    """``nosniff`` and ``no-referrer`` on every response."""

    HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)
