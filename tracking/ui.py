"""The MLflow UI of a local store, served by this process on loopback: answering in seconds, and opening every page
in the model-training view in a fresh browser.

`mlflow ui` (MLflow 3.17) starts uvicorn with four worker processes, each importing the whole server (its GenAI
gateway, assistant, job runner), and a job-execution supervisor: on a busy 2-core box its first answer took minutes
(docs/mlflow.md has the figures). Here one process imports MLflow's own application (`mlflow.server.fastapi_app`,
the same routes and pages) and serves it with one uvicorn worker, job execution off.

The view: MLflow 3.17.2's UI picks GenAI or model training from the URL's `workflowType`, else the browser's
localStorage entry `mlflow.workflowType_v1`, else GenAI (tracking/links.py). Links the UI draws itself (the
experiment list, a run's "Parent run", breadcrumbs) carry no `workflowType`, so a fresh browser following one
lands in the GenAI view. The page served here sets that entry to model training when the browser has none (a
person's own choice, made with the sidebar's switch, is kept): every link then opens the runs, charts and Dataset
column, as the experiments are marked (`tracking.store.EXPERIMENT_KIND`).
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

VIEW_KEY = "mlflow.workflowType_v1"  # the UI's localStorage key (its useLocalStorage hook: `${key}_v${version}`)
# Before the UI's bundle: a browser with no choice of its own gets the model-training view.
DEFAULT_VIEW_SCRIPT = (f'<script>try{{if(!localStorage.getItem("{VIEW_KEY}"))'
                       f'localStorage.setItem("{VIEW_KEY}",JSON.stringify("machine_learning"))}}catch(e){{}}</script>')


def with_default_view(index_html: bytes) -> bytes:
    """The UI's index.html with DEFAULT_VIEW_SCRIPT first in its <head>."""
    return index_html.replace(b"<head>", b"<head>" + DEFAULT_VIEW_SCRIPT.encode(), 1)


def app(store_uri: str):
    """MLflow's server application over `store_uri` (a local store: sqlite, or a file store), its index page
    opening in the model-training view."""
    from mlflow.server.constants import ARTIFACT_ROOT_ENV_VAR, BACKEND_STORE_URI_ENV_VAR

    os.environ[BACKEND_STORE_URI_ENV_VAR] = store_uri
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    if store_uri.startswith("sqlite:///"):  # new experiments' artifacts beside the database, as the jobs put them
        from tracking.store import artifact_root

        os.environ.setdefault(ARTIFACT_ROOT_ENV_VAR, artifact_root(store_uri))
    import flask
    from mlflow.server import app as flask_app
    from mlflow.server.fastapi_app import app as server

    serve_index = flask_app.view_functions["serve"]

    def index():
        response = flask.make_response(serve_index())
        if response.mimetype == "text/html":
            response.direct_passthrough = False
            response.set_data(with_default_view(response.get_data()))
        return response

    flask_app.view_functions["serve"] = index
    return server


def serve(store_uri: str, port: int) -> None:
    """Serve the UI on 127.0.0.1:`port` until interrupted (never another interface: runs are not for the network)."""
    import uvicorn

    server = app(store_uri)
    log.info("MLflow UI of %s on http://127.0.0.1:%d (Ctrl-C to stop)", store_uri, port)
    uvicorn.run(server, host="127.0.0.1", port=port, workers=1, log_level="warning")
