"""What the rollout server does, below HTTP: the wire models (``protocol``), one serving object
per resource (``serving``), sampling requests into recorded groups (``service``,
``sampling``), chat templating and parsing (``chat``, ``parsers``), multi-turn episodes
(``episodes``), admission control (``admission``), streamed text (``partial_text``) and the
trajectory view. It raises domain errors (``errors``), never HTTP ones; it imports the
engines and the Redis protocol (``gspo_rl.redisq``), never ``gspo_rl.server.api``."""
