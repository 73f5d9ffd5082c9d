"""Open the MLflow UI of the store the jobs log to, on this machine, in seconds.

    python jobs/mlflow_ui.py [--store sqlite:///ABS/PATH/mlruns/mlflow.db] [--port 5000]

then open the link a job printed (http://127.0.0.1:5000/#/experiments/...). The store is --store, else
MLFLOW_TRACKING_URI, else ./mlruns/mlflow.db: the one the jobs log to from this folder. It serves MLflow's own UI
and REST API on 127.0.0.1 from this process (one worker, no job runner: `tracking/ui.py`), with every page opening
in the model-training view, also the links MLflow draws itself (a run's "Parent run"). A tracking server
(http://...) serves its own UI: open it instead.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__":  # `python jobs/X.py` from any shell: find the project; outside its venv, say how in one line
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from jobs._preflight import require_project_env

    require_project_env(__file__)

from jobs._common import HelpFormatter, setup_logging
from tracking.links import LOCAL_UI
from tracking.store import resolve_tracking_uri


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mlflow_ui", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=HelpFormatter)
    p.add_argument("--store", help="the local MLflow store (default: MLFLOW_TRACKING_URI, else ./mlruns/mlflow.db)")
    p.add_argument("--port", type=int, default=int(LOCAL_UI.rsplit(":", 1)[1]),
                   help="port on 127.0.0.1 (the jobs' links name 5000)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging()
    store = resolve_tracking_uri(args.store)
    if store.startswith(("http://", "https://")):
        print(f"mlflow_ui: error: {store} is a tracking server: open {store} in a browser (it serves its own UI)",
              file=sys.stderr)
        return 2
    if store.startswith("sqlite:///") and not Path(store[len("sqlite:///"):]).is_file():
        print(f"mlflow_ui: error: no MLflow store at {store}: run a job first, or pass --store with the store a job "
              "printed", file=sys.stderr)
        return 2
    from tracking.ui import serve

    try:
        serve(store, args.port)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
