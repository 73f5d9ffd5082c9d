"""A fault-injecting HTTP proxy on 127.0.0.1 in front of an S3-protocol server (moto), for tests of our retries.

Requests are numbered in arrival order (all connections together). Every ``slow_every``-th is answered
``503 SlowDown`` (S3's throttling answer) without reaching the server; every ``drop_every``-th is forwarded, and
then its connection is dropped part-way through the answer: the status line, the headers and half of the body
are sent and the socket is closed (a reset mid-read; for a write the store has applied it, and only the answer is
lost). A request numbered by both is answered 503. Everything else is passed through unchanged.

Two more faults, for the writer lease's tests: ``unavailable(part, seconds)`` answers 503 to every request whose path
holds ``part`` for that long (one key throttled, or cut off by a partition); ``strip_conditions=True`` drops the
``If-None-Match``/``If-Match`` headers of every request (a store that ignores conditional writes).

    with FaultProxy(upstream="http://127.0.0.1:5000") as proxy:
        ... endpoint_url=proxy.url ...
        proxy.counts  # {"requests": n, "slowdown": a, "dropped": b}
"""
from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your '
                 b'request rate.</Message><RequestId>fault-proxy</RequestId></Error>')
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as clients expect from S3

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        proxy: FaultProxy = self.server.proxy  # type: ignore[attr-defined]
        body = self._body()
        n, fault = proxy.next_fault(self.path, self.command)
        if fault == "slowdown":
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(SLOWDOWN_BODY)))
            self.end_headers()
            self.wfile.write(SLOWDOWN_BODY)
            return
        upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP
                       and not (proxy.strip_conditions and k.lower() in ("if-match", "if-none-match"))}
            headers["Content-Length"] = str(len(body))
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            status, reason, answer_headers = response.status, response.reason, response.getheaders()
        finally:
            upstream.close()
        head = [f"HTTP/1.1 {status} {reason}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in answer_headers if k.lower() not in HOP_BY_HOP | {"content-length"}]
        length = len(data) if self.command != "HEAD" else int(dict((k.lower(), v) for k, v in answer_headers)
                                                               .get("content-length", 0))
        head.append(f"Content-Length: {length}\r\n\r\n")
        payload = "".join(head).encode("latin-1") + (data if self.command != "HEAD" else b"")
        if fault == "drop":
            cut = len(payload) - max(1, len(data) // 2) if data else len(payload) // 2
            self.wfile.write(payload[:cut])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


class FaultProxy:
    """The proxy (see the module docstring); a context manager that starts and stops its server thread."""

    def __init__(self, upstream: str, slow_every: int = 5, drop_every: int = 9, strip_conditions: bool = False) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.slow_every, self.drop_every, self.strip_conditions = slow_every, drop_every, strip_conditions
        self._unavailable: tuple[str, float, tuple[str, ...]] | None = None
        self.counts = {"requests": 0, "slowdown": 0, "dropped": 0}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.proxy = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    def unavailable(self, part: str, seconds: float, methods: tuple[str, ...] = ()) -> None:
        """Answer 503 to every request whose path holds ``part`` (and whose method is one of ``methods``, when
        given), for ``seconds`` from now."""
        with self._lock:
            self._unavailable = (part, time.monotonic() + seconds, methods)

    def next_fault(self, path: str = "", method: str = "") -> tuple[int, str | None]:
        with self._lock:
            self.counts["requests"] += 1
            n = self.counts["requests"]
            fault = "slowdown" if n % self.slow_every == 0 else "drop" if n % self.drop_every == 0 else None
            if self._unavailable and self._unavailable[0] in path and time.monotonic() < self._unavailable[1] and \
                    (not self._unavailable[2] or method in self._unavailable[2]):
                fault = "slowdown"
            if fault == "slowdown":
                self.counts["slowdown"] += 1
            elif fault == "drop":
                self.counts["dropped"] += 1
            return n, fault

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
