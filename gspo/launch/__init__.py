"""``gspo up``: the whole system on one machine (``up``), its run directory (``run_dir``) and
its records (``runlog``: reading them, their curves, their plot, their summary)."""
