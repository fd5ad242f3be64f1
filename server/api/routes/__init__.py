"""One router per resource, thin: parse the body, call ``gspo_rl.server.rollouts`` (or the
store), shape the response."""
