"""Fine-tuning: read task files (`records`), build labelled examples and label maps (`examples`), featurise
(`features`, `qa`, `prepare`), train and evaluate every epoch (`loop`), score (`evaluation`, `metrics`).

Ray-free and MLflow-free (the layering test holds it to that): it uses training's optimizer step, tracker and Ray
worker; ``jobs/finetune.py`` drives it.
"""
