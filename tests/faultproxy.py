"""A fault-injecting HTTP proxy on 127.0.0.1 in front of an S3 test server.

Each request is forwarded to the upstream server, except that with probability ``rate``
(drawn from a seeded generator, so a run is repeatable) the proxy instead:

``503``       answers ``503 SlowDown`` with an S3 error body (throttling);
``drop``      closes the connection without an answer (a reset);
``delay``     waits ``delay_s`` before forwarding (a slow network);
``truncate``  forwards, but sends only half of the upstream body before closing.

``counts`` tells how many faults of each kind were injected.  Shared by the storage-fault
tests and ``bench/chaos.py``.
"""

from __future__ import annotations

import http.client
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

KINDS = ("503", "drop", "delay", "truncate")
SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class FaultProxy:
    def __init__(self, upstream: str, rate: float = 0.1, kinds=KINDS, seed: int = 0, delay_s: float = 0.5) -> None:
        self.upstream = urlsplit(upstream)
        self.rate, self.kinds, self.delay_s = rate, tuple(kinds), delay_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {k: 0 for k in self.kinds}
        self.requests = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._draw()
                if fault == "503":
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOWDOWN)))
                    self.end_headers()
                    self.wfile.write(SLOWDOWN)
                    return
                if fault == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "delay":
                    time.sleep(proxy.delay_s)
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "proxy-connection")}
                conn.request(self.command, self.path, body=body if body or length else None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(k, v)
                # A HEAD answer carries the object's size with no body: pass the upstream's length on.
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if fault == "truncate" and self.command != "HEAD" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.close()
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _draw(self) -> str | None:
        with self.lock:
            self.requests += 1
            if self.kinds and self.rng.random() < self.rate:
                kind = self.rng.choice(self.kinds)
                self.counts[kind] += 1
                return kind
        return None

    def __enter__(self) -> "FaultProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
