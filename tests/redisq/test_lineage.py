"""Staleness along the learner's resumes (``gspo_rl.redisq.ready.lineage``)."""

from __future__ import annotations

from gspo_rl.redisq.ready.lineage import Lineage


def test_without_resumes_staleness_is_the_version_difference() -> None:
    assert Lineage().staleness(10, 7) == 3
    assert Lineage().staleness(10, 10) == 0


def test_a_resume_counts_from_the_checkpoint_not_from_the_lost_versions() -> None:
    # Checkpoint at 10, versions up to 16 published, then a crash: resumed as 17.
    lin = Lineage()
    lin.resumed(10, 17)
    assert lin.staleness(17, 10) == 0  # sampled from the very weights being trained
    assert lin.staleness(17, 8) == 2
    assert lin.staleness(19, 10) == 2  # two updates since the resume
    assert lin.staleness(17, 12) == 2  # a lost branch, two updates past the checkpoint
    assert lin.staleness(18, 16) == 7
    assert lin.staleness(19, 17) == 2  # sampled after the resume: plain
    lin.resumed(18, 25)  # a second crash: checkpoint 18 (= 11 on the first lineage)
    assert lin.staleness(25, 18) == 0
    assert lin.staleness(25, 10) == 1 + 0  # 18 -> 17 -> (the weights of) 10
    assert lin.staleness(26, 20) == 1 + 2


def test_the_lineage_survives_a_checkpoint_and_old_gaps_are_forgotten() -> None:
    lin = Lineage()
    lin.resumed(10, 17)
    lin.resumed(5, 5)  # not a gap
    again = Lineage.from_json(lin.to_json())
    assert again.gaps == [(10, 17)]
    assert again.staleness(17, 10) == 0
    again.forget_before(30, horizon=4)
    assert again.gaps == [] and again.staleness(30, 10) == 20
    assert Lineage.from_json(None).gaps == [] and Lineage.from_json([[3, 2]]).gaps == []
