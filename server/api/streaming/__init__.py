"""``stream: true`` on chat and completions: server-sent-event framing (``sse``), a group's
progress as chunks (``group``), the chunk shapes per route (``views``) and each route's
streamed request, from its serving object (``serve``)."""
