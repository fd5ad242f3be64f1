"""Messages to tokens and back: rendering through the chat template (``render``), safe under
concurrency and with control tokens in messages encoded as text (``sanitize``)."""
