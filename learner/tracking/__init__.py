"""Experiment tracking: every record of the metrics JSONL fanned out to TensorBoard, Weights &
Biases and MLflow (``base``: names, the installed check, the record flattening and the
fan-out; ``backends``: one class per tracker; ``run_info``: the run's git commit)."""
