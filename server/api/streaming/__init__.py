"""``stream: true`` on chat and completions: server-sent-event framing (``sse``), a group's
progress as chunks (``group``) and the chunk shapes per route (``views``)."""
