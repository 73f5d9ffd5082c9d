"""Time to the first answer of the MLflow UI commands on one local store: `python jobs/mlflow_ui.py` (what the jobs
print) against `mlflow ui` (MLflow's own), each started fresh; the index page and one REST call (experiments
search), polled every 0.2 s from the start. Prints a markdown table.

    python benchmarks/mlflow_ui_start.py --store sqlite:////abs/path/mlruns/mlflow.db [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_answer(cmd: list[str], port: int, timeout: float = 600.0) -> tuple[float, float, bool]:
    """(seconds to the index page, to the first API answer, whether the page sets the model-training view)."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})
    index = api = None
    body = b""
    try:
        while api is None:
            if time.time() - t0 > timeout or proc.poll() is not None:
                raise RuntimeError(f"{cmd[:3]}: no answer (exit code {proc.poll()})")
            try:
                if index is None:
                    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()
                    index = time.time() - t0
                urllib.request.urlopen(urllib.request.Request(
                    f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/experiments/search", data=b'{"max_results": 10}',
                    headers={"Content-Type": "application/json"}), timeout=10).read()
                api = time.time() - t0
            except OSError:
                time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return index, api, b"mlflow.workflowType_v1" in body


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", required=True, help="a local store (sqlite:///...) the jobs logged to")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--only-ours", action="store_true", help="time jobs/mlflow_ui.py only (a quick check)")
    args = p.parse_args()
    mlflow = str(Path(sys.executable).parent / "mlflow")
    commands = {
        "python jobs/mlflow_ui.py --store STORE": lambda port: [sys.executable, str(REPO / "jobs" / "mlflow_ui.py"),
                                                                "--store", args.store, "--port", str(port)],
        "mlflow ui --backend-store-uri STORE": lambda port: [mlflow, "ui", "--backend-store-uri", args.store,
                                                             "--port", str(port)],
    }
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print("| command | index page (s) | first API answer (s) | opens in the model-training view |")
    print("|---|---:|---:|---|")
    for name, cmd in list(commands.items())[:1 if args.only_ours else None]:
        runs = [first_answer(cmd(port), port) for port in (_port() for _ in range(args.repeat))]
        print(f"| `{name}` | {statistics.median(r[0] for r in runs):.1f} | {statistics.median(r[1] for r in runs):.1f}"
              f" | {'yes' if runs[0][2] else 'no (GenAI for a fresh browser)'} |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
