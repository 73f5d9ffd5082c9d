"""training: the BERT trainer. Typed configs (`training.config`: `PretrainConfig`), the training loader
(`training.loader`), the train steps (`training.step`), `training.loop.fit(config, worker)` (the whole pre-training
loop in one process, free of Ray), optimizers and schedules, checkpoints and exports, metric sums, the one MLflow
module (`training.tracking`: run opener, param flattener, tracker, datasets), the one Ray module (`training.launch`:
a run on Ray Train workers or in this process, Ray on loopback), and what `jobs/pretrain.py` calls
(`training.pretrain_job`). Fine-tuning (`finetuning/`) uses the same pieces.

The package imports nothing itself: `training.tracking` (which the dataset build uses) loads without torch.
Imports point one way: jobs -> training -> pipeline, bert_core (tests/test_layering.py).
"""
