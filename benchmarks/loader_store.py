"""A counting, optionally slowed, HTTP server of a local folder on loopback, with byte ranges: the store the loader
benchmark (`benchmarks/loader_scale.py`) and the loader's read tests measure against.

    with CountingStore(folder, latency=0.1) as store:     # 100 ms before every response
        url = store.url + "/dataset"                        # http://127.0.0.1:PORT/dataset
        ... store.bytes, store.requests                     # body bytes sent and requests answered so far
        store.reset()

Only GET (whole or one `Range: bytes=a-b`) and HEAD; files only, no listing; paths stay inside the folder.
"""
from __future__ import annotations

import http.server
import os
import re
import threading
import time
from pathlib import Path


class CountingStore:
    def __init__(self, folder: str | os.PathLike, latency: float = 0.0) -> None:
        self.folder, self.latency = Path(folder).resolve(), latency
        self.bytes = self.requests = 0
        self.log: list[tuple[str, int, int]] = []
        """(path, offset, size) of every GET, in the order served."""
        self._lock = threading.Lock()
        store = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _file(self) -> Path | None:
                path = (store.folder / self.path.split("?")[0].lstrip("/")).resolve()
                if store.folder not in path.parents or not path.is_file():
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                return path

            def do_HEAD(self) -> None:  # noqa: N802 (http.server's name)
                path = self._file()
                if path is None:
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(path.stat().st_size))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                if store.latency:
                    time.sleep(store.latency)
                path = self._file()
                if path is None:
                    return
                size = path.stat().st_size
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                start, end = (int(m.group(1)), min(size, int(m.group(2)) + 1 if m.group(2) else size)) if m \
                    else (0, size)
                with open(path, "rb") as f:
                    f.seek(start)
                    body = f.read(max(0, end - start))
                self.send_response(206 if m else 200)
                if m:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                with store._lock:  # counted before it is sent: the client sees nothing before the count
                    store.bytes += len(body)
                    store.requests += 1
                    store.log.append((str(path.relative_to(store.folder)), start, len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="counting-store")

    def reset(self) -> None:
        with self._lock:
            self.bytes = self.requests = 0
            self.log.clear()

    def __enter__(self) -> CountingStore:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
