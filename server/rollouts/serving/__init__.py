"""What the sampling routes call, below HTTP (vLLM's ``serving`` modules): a request's options
checked, its prompt built, its group sampled through ``SamplingService`` and the response
shaped (``chat``, ``completions``; the shared pieces in ``formatting``). The routes in
``gspo_rl.server.api.routes`` only bind these to HTTP."""
