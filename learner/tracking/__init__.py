"""Experiment tracking: every record of the metrics JSONL fanned out to TensorBoard, Weights &
Biases, MLflow and a Prometheus exporter (``base``: names, the installed check, the record
flattening and the fan-out; ``backends``: one class per tracker, ``prometheus`` the exporter's;
``samples``: tables of sampled episodes; ``run_info``: the run's git commit)."""
