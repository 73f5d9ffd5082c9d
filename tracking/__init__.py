"""All of MLflow, and the only package that imports it (tests/test_layering.py holds it to that).

- `store`: where runs are tracked (the URI, the reachability check, experiments in the model-training view)
- `params`: a typed config as MLflow params
- `runs`: the one run opener (`open_run`) and a job's `Run`
- `tracker`: how a training loop's rank 0 logs metrics into the job's run
- `datasets`: a build's output, and a training run's input, as the same MLflow dataset
- `build_run`: the dataset build's run (params, stages, report, dataset)
- `lineage`: the runs' descriptions linking each run to those it came from and those made from it
- `links`, `notes`: links into the UI (model-training view), run descriptions
- `ui`: the UI of a local store, served in seconds, every page in the model-training view (`jobs/mlflow_ui.py`)
- `config`: `TrackingConfig`, what a training loop needs to log

Every job logs one run: `open_run` creates it, or reopens the run a rerun should continue (found by a tag, e.g.
the pre-training run name). The job's driver logs the params (`flatten_params` of its typed config) and ends the
run (`Run.ending`); rank 0 of the loop logs metrics into it through `MlflowTracker`. After a worker-group restart,
or a rerun with the same run name, training replays the steps since the last checkpoint; their metrics are already
in the run, so each (metric, step) is logged once: what is there is skipped. A rollback of the guard is different:
it redoes steps on other batches, so it rewinds that rule (`MlflowTracker.rewind`).

mlflow is imported inside the functions: importing a trainer (`fit` without tracking) never loads it.
"""
