"""The plain transformers engine (``engine``): continuous batching with a KV cache, exact
log-probabilities; its requests, running batch, tensor helpers and attention."""
