"""The admission rule (gspo_rl.contract.admission), a pure function: how many groups may be in
flight so that the newest is trained within the learner's staleness bound."""

from __future__ import annotations

from gspo_rl.contract.admission import (
    LearnerParams,
    admits,
    budget_counted,
    capacity,
    in_drought,
)


def test_capacity_is_staleness_plus_one_steps_of_groups_less_the_servers_lag() -> None:
    assert capacity(2, 4) == 12  # (2 + 1) x 4: the demo's and the compose profile's
    assert capacity(0, 4) == 4  # on-policy: one step's worth, all sampled by one version
    assert capacity(2, 4, lag=1) == 8  # the server trails by a version: one step less
    assert capacity(2, 4, lag=3) == 0  # anything sampled now would arrive too stale
    assert capacity(2, 4, lag=-2) == 12  # a server ahead of the published version: lag 0
    assert capacity(None, 4) is None  # no staleness bound: no admission bound


def test_admits_while_one_more_group_fits() -> None:
    assert admits(11, 12) and not admits(12, 12) and not admits(13, 12)
    assert admits(0, 1) and not admits(0, 0)
    assert admits(10_000, None)


def test_learner_params_from_the_published_hash() -> None:
    raw = {b"version": b"7", b"step": b"7", b"max_staleness": b"2", b"groups_per_step": b"4",
           b"training": b"4"}
    p = LearnerParams.from_hash(raw)
    assert (p.version, p.max_staleness, p.groups_per_step, p.training) == (7, 2, 4, 4)
    assert p.bound(server_version=7, fallback=99) == 12
    assert p.bound(server_version=6, fallback=99) == 8
    unbounded = LearnerParams.from_hash({"version": "3", "max_staleness": "-1",
                                         "groups_per_step": "4"})
    assert unbounded.bound(server_version=3, fallback=99) is None
    # No learner has published its parameters (none yet, or one from before admission).
    assert LearnerParams.from_hash({}).bound(server_version=0, fallback=12) == 12
    assert LearnerParams.from_hash({b"version": b"5"}).bound(server_version=0, fallback=6) == 6


def test_the_budget_always_leaves_one_steps_groups_free() -> None:
    assert budget_counted(5, bound=12, groups_per_step=4) == 5  # room: every one counts
    assert budget_counted(10, bound=12, groups_per_step=4) == 8  # 4 slots stay free
    assert budget_counted(3, bound=4, groups_per_step=4) == 0  # synchronous: never counted
    assert budget_counted(3, bound=2, groups_per_step=4) == 0  # a lagging server's bound
    assert budget_counted(3, bound=None, groups_per_step=4) == 3  # no bound: counted as is
    assert budget_counted(3, bound=8, groups_per_step=None) == 3  # no learner yet


def test_in_a_drought_the_budget_counts_every_held_group() -> None:
    assert in_drought(4, groups_per_step=4) and in_drought(9, groups_per_step=4)
    assert not in_drought(3, groups_per_step=4)  # fewer than one step's groups ended dry
    assert not in_drought(0, groups_per_step=None) and in_drought(1, groups_per_step=None)
    assert budget_counted(10, bound=12, groups_per_step=4, drought=True) == 10
    assert budget_counted(3, bound=4, groups_per_step=4, drought=True) == 3
