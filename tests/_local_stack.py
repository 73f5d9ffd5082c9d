"""Running scripts/local_stack.sh from a test: free loopback ports for its components, and one of its commands."""
from __future__ import annotations

import socket
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports free now (all bound at once, so none repeats)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def local_stack(cmd: str, env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "scripts" / "local_stack.sh"), cmd], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
