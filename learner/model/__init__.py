"""The trained policy and its kernels: the Hugging Face model and the log-probabilities of
sampled tokens (``policy``), the fused chunked log-prob head (``logprob_head``,
``head_kernels``), variable-length attention for packed rows (``varlen``), bf16 parameters
with float32 master weights (``precision``) and the speed levers (``speed``)."""
