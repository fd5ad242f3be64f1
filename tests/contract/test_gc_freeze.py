"""gspo_rl.contract.gc_freeze: start-up objects out of the collector's generations, and back."""

from __future__ import annotations

import gc
import weakref

from gspo_rl.contract.gc_freeze import freeze_startup_objects


def test_freezing_collects_garbage_first_and_hides_what_is_alive_from_full_collections() -> None:
    class Node:
        def __init__(self) -> None:
            self.other: Node | None = None

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle, garbage once the names go
    cycle = weakref.ref(a)
    del a, b
    alive = [Node() for _ in range(100)]
    try:
        frozen = freeze_startup_objects()
        assert frozen == gc.get_freeze_count() > 0
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in tracked for o in alive)  # in the permanent generation
        assert cycle() is None  # collected, not frozen for good
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
    assert all(gc.is_tracked(o) for o in alive)
