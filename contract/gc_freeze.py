"""The garbage collector in long-running processes (the rollout server, the learner): start-up
objects out of its generations. No dependency on the server or the learner."""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Moves every object alive now (torch, transformers, the model: ~400k objects for a
    tiny model) out of the collector's generations, after collecting start-up garbage;
    returns how many were frozen. A full collection walks every tracked object with the GIL
    held: 170-190 ms here with torch loaded (0.1 ms after the freeze). In the server that
    stalled the engine's thread for ~24 decode steps each time a burst of requests triggered
    one; in a learner it is a ~0.2 s pause whenever one comes (start-up, bursts of long-lived
    objects). After the freeze a full collection walks only what was allocated since.
    ``gc.unfreeze()`` undoes it (for processes that start and stop several)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
