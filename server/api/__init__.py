"""The HTTP layer of the rollout server: the app factory, thin routes (one router per
resource), dependencies, request limits, the one JSON error shape (domain errors mapped to HTTP
statuses here and nowhere else) and server-sent-event framing. It calls ``rollouts`` and the
engines; nothing below it imports it."""
