"""A pass-through HTTP proxy on 127.0.0.1 that counts what a store sends: requests per (method, path) and the body
bytes of each GET per path (query left out). Put it in front of an http file server (``_ranged_http.RangedStore``)
or an S3-protocol server (moto): the counts are what the build costs that store.

    with CountingProxy("http://127.0.0.1:5000") as proxy:
        ... proxy.url ...
        proxy.sent["/bucket/key"], proxy.requests[("HEAD", "/bucket/key")], proxy.lists
"""
from __future__ import annotations

import http.client
import threading
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
               "content-length"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _handle(self) -> None:
        proxy: CountingProxy = self.server.proxy  # type: ignore[attr-defined]
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            status, reason, answer = response.status, response.reason, response.getheaders()
        finally:
            upstream.close()
        path, _, query = self.path.partition("?")
        with proxy.lock:
            proxy.requests[(self.command, path)] += 1
            if self.command == "GET" and "list-type" in query:
                proxy.lists += 1
            elif self.command == "GET":
                proxy.sent[path] += len(data)
        self.send_response_only(status, reason)
        for k, v in answer:
            if k.lower() not in _HOP_BY_HOP:
                self.send_header(k, v)
        length = len(data) if self.command != "HEAD" else int(dict((k.lower(), v) for k, v in answer)
                                                               .get("content-length", 0))
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


class CountingProxy:
    """The proxy (see the module docstring): a context manager that starts and stops its server thread."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.lock = threading.Lock()
        self.sent: Counter[str] = Counter()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.lists = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.proxy = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def clear(self) -> None:
        with self.lock:
            self.sent.clear()
            self.requests.clear()
            self.lists = 0

    def total(self, prefix: str = "/") -> int:
        """GET body bytes sent for the paths under ``prefix``."""
        return sum(v for k, v in self.sent.items() if k.startswith(prefix))

    def __enter__(self) -> CountingProxy:
        threading.Thread(target=self._server.serve_forever, name="counting-proxy", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
