"""The ready stream: the entries a published group becomes (``entry``) and the learner's side
of the stream (``reader``: delivery, claims, acknowledgement and trimming; ``scripts``: its
Lua)."""
