"""The rollout server: inference engines and the HTTP API (the Redis schema: ``contract``; its
stores: ``redisq``)."""
