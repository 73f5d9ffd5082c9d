"""workflows: the whole pipeline as one resumable DAG of stand-alone jobs, [train vocab] -> build dataset(s) ->
pre-train phase(s) -> fine-tune task(s), driven by a YAML config (configs/*.yaml) through `jobs/workflow.py`.

`config` reads the YAML; `specs` holds one spec per job (its wiring, outputs, completeness, key numbers); `plan`
turns the config into fingerprinted stages and decides which run; `state` keeps done-markers and the lock in the
workdir; `execute` runs one stage as a subprocess; `driver` runs the plan under one parent MLflow run; `summary`
says where everything is.
"""
