"""What the routes call, below HTTP (vLLM's ``serving`` modules): one serving object per
resource, built once in the app's lifespan (``gspo_rl.server.api.app.build_serving``) and
handed to its routes by a dependency (``gspo_rl.server.api.deps``). ``ChatServing``,
``CompletionServing`` and ``RolloutServing`` check a request's options, build its prompt,
sample and record its group through the shared ``SamplingService`` and shape the response
(the shared pieces in ``formatting``); ``GroupServing``, ``RewardServing``, ``EvalServing``,
``TaskServing``, ``ModelServing``, ``HealthServing`` and ``WeightServing`` (the admin weight
routes, over the engine's ``WeightReceiver``) do the same for their resources. They take and
return the wire models of ``gspo_rl.server.rollouts.protocol`` and raise domain errors;
the routes in ``gspo_rl.server.api.routes`` only bind them to HTTP."""
