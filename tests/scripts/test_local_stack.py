"""scripts/local_stack.sh's checks that need no running stack (the whole stack is exercised, slowly, by
tests/jobs/test_ray_job_submit.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _local_stack import free_ports, local_stack

REPO = Path(__file__).resolve().parents[2]


def _stack(cmd: str, env: dict) -> subprocess.CompletedProcess:
    return local_stack(cmd, env, timeout=120)


def test_start_refuses_a_port_another_server_holds(tmp_path):
    """Port 5000 (here: a free one) answered by someone else's server: `start` must not report "up" (its MLflow
    would exit while theirs answers the health check, and jobs would log there); it names the port and the
    variable to change, before starting anything."""
    import http.server
    import threading

    ray_port, dash_port = free_ports(2)
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    state = tmp_path / "stack"
    env = dict(os.environ, LOCAL_STACK_DIR=str(state), RAY_PORT=str(ray_port), RAY_DASHBOARD_PORT=str(dash_port),
               MLFLOW_PORT=str(other.server_address[1]),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("RAY_ADDRESS", None)
    try:
        started = _stack("start", env)
    finally:
        other.shutdown()
        _stack("stop", env)
    assert started.returncode != 0 and "is up" not in started.stdout
    assert f"port {other.server_address[1]} is taken by another process" in started.stderr
    assert "MLFLOW_PORT" in started.stderr
    assert not (state / "mlflow.sid").exists() and not (state / "ray.sid").exists()  # nothing was started
