"""training: the runtime both trainers (pretraining/, finetuning/) share, free of Ray but for its launcher. The one
job skeleton (``job.py``: ``run_job(JobParts)``), the launcher (``launch.py``: a ``fit`` run in this process or on
Ray Train workers; ``rendezvous.py`` its torch backend) and the contract it hands a loop (``worker.py``: Worker,
FitResult, Checkpoints), checkpoints (``checkpoint.py``: on local disk, or through Ray Train with the module the
launcher hands in), exports and lineage (``export.py``), ``--init`` from a URL (``model_fetch.py``), optimizers
and schedules (``optim.py``), the divergence guard (``guard.py``), progress lines, the update step with autocast
(``step.py``), default learning rates (``defaults.py``), a collapsed model named (``collapse.py``), the model's
memory floor (``model_size.py``).

The package imports nothing itself: ``tracking`` (which the dataset build uses) loads without torch.
"""
