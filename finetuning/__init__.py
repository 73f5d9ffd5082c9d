"""finetuning: BERT on downstream tasks, shaped like pre-training. `FinetuneConfig` composes the task and its data
(`prepare.TaskConfig`: files read by `records`, examples and label maps by `examples`, features by `features` and
`qa`), the model it starts from (`task_model.HeadConfig`) and the schedule (`schedule.ScheduleConfig`);
`fit(config, worker)` trains and evaluates every epoch (scored by `evaluation` and `task_metrics`);
`finetune_job.run_finetuning` is what `jobs/finetune.py` calls.

Ray-free and MLflow-free (the layering test holds it to that): it uses training's Worker, launcher, tracker,
optimizer step and export.
"""
from finetuning.config import FinetuneConfig
from finetuning.loop import fit

__all__ = ["FinetuneConfig", "fit"]
