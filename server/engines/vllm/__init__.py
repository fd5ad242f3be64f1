"""The vLLM engine (``engine``: ``AsyncLLM`` in this process) and what runs inside vLLM's
worker processes (``worker``, ``cpu_worker``): the receiving end of the weight broadcast."""
