"""Links into the MLflow UI open the model-training view (MLflow 3.17.2 reads the `workflowType` parameter)."""
import sys
from pathlib import Path

from tracking.links import experiment_url, run_url, ui_command


def test_a_server_store_links_to_itself_in_the_model_training_view():
    assert experiment_url("http://mlflow.team:5000/", "7") == (
        "http://mlflow.team:5000/#/experiments/7/runs?workflowType=machine_learning")
    assert run_url("http://127.0.0.1:5001", "7", "abc") == (
        "http://127.0.0.1:5001/#/experiments/7/runs/abc?workflowType=machine_learning")
    assert ui_command("http://127.0.0.1:5001") is None


def test_a_local_store_links_to_the_ui_that_its_command_serves():
    uri = "sqlite:////work/mlruns/mlflow.db"
    assert experiment_url(uri, "1").startswith("http://127.0.0.1:5000/#/experiments/1/runs?")
    job = Path(__file__).resolve().parents[2] / "jobs" / "mlflow_ui.py"
    assert ui_command(uri, "/venv/bin/python") == (f"/venv/bin/python {job} --store sqlite:////work/mlruns/mlflow.db"
                                                   " --port 5000")
    assert ui_command(uri).startswith(f"{sys.executable} {job} ")  # this interpreter: the venv's, from any shell
