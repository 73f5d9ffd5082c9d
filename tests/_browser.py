"""Headless Chromium driven over the DevTools protocol, with the standard library only (no Selenium, no Playwright):
open a page, wait for text, click a link the way a person does, read the DOM and the URL, take a screenshot.

The protocol runs over a WebSocket; the few frames a test needs (masked text frames out, text frames in) are
written here in ~40 lines rather than adding a client dependency for the tests.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class _WebSocket:
    def __init__(self, url: str, timeout: float = 60.0) -> None:
        host_port, path = url[len("ws://"):].split("/", 1)
        host, port = host_port.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert b" 101 " in head.split(b"\r\n")[0], head

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("DevTools socket closed")
            data += chunk
        return data

    def send(self, text: str) -> None:
        payload = text.encode()
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                                bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                                bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            data = self._read(n)
            if b0 & 0x0F == 0x8:
                raise ConnectionError("DevTools socket closed")
            if b0 & 0x0F in (0x9, 0xA):  # ping / pong: nothing a test needs
                continue
            message += data
            if b0 & 0x80:
                return message.decode()


class Browser:
    """One headless Chromium with its own profile (a fresh browser: nothing remembered from earlier visits)."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000) -> None:
        assert CHROMIUM, "needs Chromium: apt-get install chromium"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", "--remote-debugging-address=127.0.0.1",
             f"--remote-debugging-port={port}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            assert self.proc.poll() is None and time.time() < deadline, "Chromium did not start"
            time.sleep(0.3)
        self.ws = _WebSocket(pages[0]["webSocketDebuggerUrl"])
        self._id = 0

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def url(self) -> str:
        return self.eval("location.href")

    def text(self) -> str:
        return self.eval("document.body ? document.body.innerText : ''") or ""

    def html(self) -> str:
        return self.eval("document.documentElement.outerHTML") or ""

    def wait_for(self, needle: str, timeout: float = 60.0) -> str:
        """The page's text once it contains `needle` (the UI renders after its API calls return)."""
        deadline = time.time() + timeout
        while True:
            text = self.text()
            if needle in text:
                return text
            if time.time() > deadline:
                raise AssertionError(f"{needle!r} not on {self.url()} after {timeout:.0f} s; the page says:\n"
                                     f"{text[:3000]}")
            time.sleep(0.5)

    def click_text(self, text: str, selector: str = "a, button, label, [role=radio], [role=tab], span",
                   timeout: float = 60.0) -> None:
        """Clicks the first element matching `selector` whose text is `text`, as a person would (a real mouse event
        on its centre), once the page shows it: the UI renders parts of a page as their own API calls return (a run
        page's parent-run link after its description, on a busy box seconds later)."""
        deadline = time.time() + timeout
        while not (box := self.eval(
                f"(() => {{ const e = [...document.querySelectorAll({json.dumps(selector)})].find(e => "
                f"e.innerText && e.innerText.trim() === {json.dumps(text)}); if (!e) return null; e.scrollIntoView();"
                " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")):
            if time.time() > deadline:
                raise AssertionError(f"nothing to click saying {text!r} on {self.url()} after {timeout:.0f} s")
            time.sleep(0.5)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def click_link(self, text: str) -> None:
        self.click_text(text, "a")

    def wait_for_url(self, fragment: str, timeout: float = 60.0) -> str:
        deadline = time.time() + timeout
        while fragment not in self.url():
            if time.time() > deadline:
                raise AssertionError(f"{fragment!r} not in the URL after {timeout:.0f} s: {self.url()}")
            time.sleep(0.3)
        return self.url()

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return path


@contextlib.contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """An MLflow server on loopback over a sqlite store under `folder` (artifacts there too). Yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # ~0.5 GB and ~7 s instead of 1.5 GB, 29 s
    log = open(folder / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                             f"sqlite:///{folder / 'server.db'}", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1"], cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (folder / "server.log").read_text()
            assert time.time() < deadline, "mlflow server did not answer in 120 s"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn worker
        proc.wait(30)
        log.close()
