"""Groups without a learning signal are named, with their cause, once most recent ones are
(``gspo_rl.client.signal``); the learner's stall says the same (``no_groups_detail``)."""

from __future__ import annotations

from gspo_rl.client.signal import SignalWatch, kind_of
from gspo_rl.contract.admission import LearnerParams
from gspo_rl.learner.runtime.progress import no_groups_detail
from gspo_rl.redisq.inflight import InFlightFacts


def test_kinds() -> None:
    assert kind_of([0.0, 1.0]) == "signal"
    assert kind_of([1.0, 1.0]) == "solved" and kind_of([0.0, 0.0]) == "failed"
    assert kind_of([0.5, 0.5]) == "flat" and kind_of([]) == "signal"


def test_said_once_most_recent_groups_carry_no_signal() -> None:
    said: list[str] = []
    watch = SignalWatch(window=4, share=0.5, every_s=3600, say=said.append)
    for rewards in ([0.0, 1.0], [1.0, 1.0], [0.0, 1.0]):
        watch.on_group(rewards)
    assert said == []  # the window is not full yet
    watch.on_group([1.0, 1.0])  # 2 of 4 without signal, both solved
    assert len(said) == 1
    assert said[0].startswith("2 of the last 4 groups carried no learning signal (2 solved")
    assert "the policy solves every sample of most tasks" in said[0]
    for _ in range(4):
        watch.on_group([0.0, 0.0])
    assert len(said) == 1, "at most once per every_s"
    assert "fails every sample" in (watch.line() or "")
    for _ in range(3):
        watch.on_group([0.0, 1.0])
    assert watch.line() is None


def test_the_learner_names_a_stall_of_groups_without_signal() -> None:
    facts = InFlightFacts(open=0, complete=0, undelivered=0, remote_pending=0, ready_depth=0,
                          learner=LearnerParams.from_hash({}), no_signal=7)
    detail = no_groups_detail(facts, 12)
    assert "7 groups ended since the last step, every one with equal rewards" in detail
    assert "solves or fails every sample" in detail
