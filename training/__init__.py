"""training: the BERT trainer. Typed configs (`pretraining.config`: `PretrainConfig`), the training loader
(`pretraining.loader`), the train steps (`training.step`), `pretraining.loop.fit(config, worker)` (the whole pre-training
loop in one process, free of Ray), optimizers and schedules, checkpoints and exports, metric sums, the one MLflow
module (`tracking`: run opener, param flattener, tracker, datasets), the one Ray module (`training.launch`:
a run on Ray Train workers or in this process, Ray on loopback), and what `jobs/pretrain.py` calls
(`pretraining.pretrain_job`). Fine-tuning (`finetuning/`) uses the same pieces.

The package imports nothing itself: `tracking` (which the dataset build uses) loads without torch.
Imports point one way: jobs -> training -> pipeline, bert_core (tests/test_layering.py).
"""
