"""Messages to tokens and back for the HTTP API (``render``), over the templating the learner
shares (``gspo_rl.contract.chat``: concurrency-safe rendering with control tokens in messages
encoded as text)."""
