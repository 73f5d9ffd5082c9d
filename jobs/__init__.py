"""Entry points: parse flags -> build configs -> call pipeline / bert_core -> Ray -> MLflow. No algorithms here."""
