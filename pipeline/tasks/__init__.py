"""Fine-tuning data: read task files, build labelled examples and label maps, featurise, score.

Model-free and MLflow-free (the layering test holds it to that); ``jobs/finetune.py`` drives it.
"""
