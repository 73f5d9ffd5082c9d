"""A static file server on 127.0.0.1 as object stores behave for reads (an ETag, byte ranges), counting the body
bytes it sends per file: what a build costs its store in egress."""
from __future__ import annotations

import http.server
import os
import re
import threading
from collections import Counter
from pathlib import Path

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class RangedStore:
    """``with RangedStore(root) as store``: ``store.url(name)``; ``store.sent[name]``: body bytes sent."""

    def __init__(self, root: Path):
        self.root, self.sent, self._lock = Path(root), Counter(), threading.Lock()
        store = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _serve(self, body: bool):
                name = self.path.lstrip("/").split("?", 1)[0]
                path = store.root / name
                if not path.is_file():
                    self.send_error(404)
                    return
                size = path.stat().st_size
                lo, hi, status = 0, size - 1, 200
                m = _RANGE.match(self.headers.get("Range", ""))
                if m and size:
                    if m.group(1):
                        lo, hi = int(m.group(1)), min(size - 1, int(m.group(2)) if m.group(2) else size - 1)
                    else:
                        lo = max(0, size - int(m.group(2)))
                    status = 206
                self.send_response(status)
                self.send_header("Content-Length", str(max(0, hi - lo + 1)))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", f'"{int(path.stat().st_mtime_ns)}-{size}"')
                if status == 206:
                    self.send_header("Content-Range", f"bytes {lo}-{hi}/{size}")
                self.end_headers()
                if body and hi >= lo:
                    with open(path, "rb") as f:
                        f.seek(lo)
                        data = f.read(hi - lo + 1)
                    try:
                        self.wfile.write(data)
                    except (BrokenPipeError, ConnectionResetError):
                        return  # the client stopped reading: count only what it took (the kernel's buffer aside)
                    with store._lock:
                        store.sent[name] += len(data)

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/{name}"

    def __enter__(self) -> RangedStore:
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def size_of(root: Path, name: str) -> int:
    return os.path.getsize(Path(root) / name)
