"""The request-body limit: the project's BodyLimit against Starlette's RequestBodyLimitMiddleware.

The framework's own limit would replace the hand-written one if it gave the same answer; it
does not (measured here, so a Starlette that changes this shows up): the project answers JSON
413 before any handler runs, also to a chunked body that declares no length, and 400 to an
invalid Content-Length.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from pipeline.serve.middleware import BodyLimit

LIMIT = 16


def _call(middleware, path: str, chunks: list[bytes], length: object) -> tuple[int, str, bytes, bool]:
    ran: list[bool] = []

    async def app(scope, receive, send):
        ran.append(True)
        if scope["path"] == "/read":
            while (await receive()).get("more_body"):
                pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    pending, sent = list(chunks), []

    async def receive():
        if pending:
            body = pending.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(pending)}
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    headers = [] if length is None else [(b"content-length", str(length).encode())]
    asyncio.run(middleware(app, LIMIT)({"type": "http", "method": "POST", "path": path, "headers": headers}, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]).get(b"content-type", b"").decode().split(";")[0], body, bool(ran)


CASES = {
    "declared": ("/read", [b"x" * 32], 32),
    "declared, body unread": ("/ignore", [b"x" * 32], 32),
    "chunked": ("/read", [b"x" * 10, b"x" * 10], None),
    "chunked, body unread": ("/ignore", [b"x" * 10, b"x" * 10], None),
}


@pytest.mark.parametrize("case", CASES)
def test_the_project_refuses_a_large_body_before_any_handler(case):
    status, ctype, body, ran = _call(BodyLimit, *CASES[case])
    assert (status, ctype, ran) == (413, "application/json", False)
    assert json.loads(body) == {"detail": f"request body larger than {LIMIT} bytes"}


def test_an_invalid_length_and_a_small_body():
    assert _call(BodyLimit, "/read", [b"x"], "abc")[:2] == (400, "application/json")
    assert _call(BodyLimit, "/read", [b"x" * 8], 8) == (200, "application/json", b'{"ok": true}', True)


def test_starlettes_limit_answers_otherwise():
    """Why BodyLimit stays: Starlette's answer is plain text, comes after the handler started,
    misses a chunked body the handler does not read, and passes an invalid length."""
    status, ctype, body, ran = _call(RequestBodyLimitMiddleware, *CASES["declared"])
    assert (status, ctype, body, ran) == (413, "text/plain", b"Content Too Large", True)
    assert _call(RequestBodyLimitMiddleware, *CASES["chunked, body unread"])[0] == 200
    assert _call(RequestBodyLimitMiddleware, "/read", [b"x"], "abc")[0] == 200
