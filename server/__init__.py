"""The rollout server: inference engines, the HTTP API and the Redis schema."""
