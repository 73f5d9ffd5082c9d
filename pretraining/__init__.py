"""pretraining: BERT pre-training (MLM + NSP) on a built dataset. ``config.py`` (PretrainConfig and its parts),
``loader.py`` with ``order.py`` (the global data order: the same examples at step k on any number of workers),
``rows.py``, ``batching.py``, ``packing.py``; ``loop.py`` (fit) with ``recovery.py`` (roll back, restore, save),
``step.py``, ``memory.py`` (the memory plan), ``compile.py``, ``kernel_options.py``, ``metrics.py``, ``perf.py``;
``batches.py`` (``python -m pretraining.batches``); ``pretrain_job.py`` (the job's parts). Never imports
``finetuning``."""
