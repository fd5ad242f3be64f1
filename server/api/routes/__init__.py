"""One router per resource, thin: parse the request, call the resource's serving object
(``gspo_rl.server.rollouts.serving``), return its wire model
(``gspo_rl.server.rollouts.protocol``)."""
