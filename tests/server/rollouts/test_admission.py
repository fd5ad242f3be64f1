"""Admission control (gspo_rl.server.rollouts.admission, issue 15: 88% of a compose run's groups
were dropped stale or equal). A new group is held while as many are in flight as the learner can
train within its staleness bound, released when the learner takes groups, refused with a 503 after
the longest hold; the SDK retries that 503; the in-flight count comes from facts in Redis, so
a crashed server or learner does not leave it wrong. Real uvicorn, real Redis, the hf engine
on the tiny model, the learner's own reader and state publisher."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio

from gspo_rl.client.client import AsyncGSPOClient, RetryPolicy
from gspo_rl.client.environment import SingleTurnEnvironment
from gspo_rl.client.failures import RunStats
from gspo_rl.client.runner import arun_groups
from gspo_rl.contract.schema import Keys
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.runtime.published import Heartbeat, publish_state, state_fields
from gspo_rl.learner.runtime.target import groups_in_flight
from gspo_rl.redisq.inflight import PENDING_TTL_S, InFlightCounter
from gspo_rl.redisq.ready.reader import GroupReader
from gspo_rl.server.rollouts.admission import POLL_S
from tests.conftest import RedisServer, wait_until
from tests.helpers.gspo_env import gspo_env_says
from tests.helpers.serving import API_KEY, Served, running_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
ROLLOUT = {"prompt_token_ids": [1, 2], "max_tokens": 2, "n": 2}
KEYS = Keys()


@pytest.fixture(autouse=True)
def learner_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """The learner's heartbeat while a test stands in for its other writes (without one, a
    request at the bound is refused at once, 503 ``no_learner_connected``, not held); the
    no-learner tests run without it."""
    if "no_learner" in request.node.name:
        yield
        return
    client = redis.Redis.from_url(request.getfixturevalue("redis_server").url)
    beat = Heartbeat(client, KEYS).start()
    yield
    beat.stop()
    client.close()


def post(served: Served, path: str, body: Any, timeout: float = 60) -> httpx.Response:
    return httpx.post(served.url + path, json=body, headers=AUTH, timeout=timeout)


def sample(served: Served) -> list[str]:
    r = post(served, "/v1/rollouts", ROLLOUT)
    assert r.status_code == 200, r.text
    return [x["rollout_id"] for x in r.json()["rollouts"]]


def reward(served: Served, rollout_ids: list[str], values: list[float]) -> None:
    r = post(served, "/v1/rewards", [{"rollout_id": rid, "reward": v}
                                     for rid, v in zip(rollout_ids, values, strict=True)])
    assert r.status_code == 200, r.text


def gauge(served: Served, name: str) -> float:
    text = httpx.get(served.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{")[0].split(" ")[0] == name)


def dashboard_queue(served: Served) -> dict[str, Any]:
    r = httpx.get(served.url + "/v1/dashboard/state", headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json()["queue"])


def learner_publishes(redis_url: str, model: Path, *, max_staleness: int, groups_per_step: int,
                      version: int = 0, training: int = 0, finished: str = "") -> None:
    """What the learner writes to ``Keys.learner_state`` (gspo_rl.learner.runtime.published)."""
    cfg = LearnerConfig(model=str(model), redis_url=redis_url, max_staleness=max_staleness,
                        groups_per_step=groups_per_step)
    client = redis.Redis.from_url(redis_url)
    publish_state(client, KEYS, state_fields(cfg, version, version, 0, training=training,
                                             finished=finished))
    client.close()


def test_a_new_group_is_held_at_the_bound_and_released_when_the_learner_takes_groups(
        tiny_model_dir: Path, redis_server: RedisServer) -> None:
    url = redis_server.url
    learner_publishes(url, tiny_model_dir, max_staleness=1, groups_per_step=1)  # bound 2
    with running_server(tiny_model_dir, url, admission=True, admission_wait_s=120) as s:
        first, second = sample(s), sample(s)  # open: waiting for their rewards
        assert gauge(s, "gspo_groups_in_flight") == 2 and gauge(s, "gspo_admission_bound") == 2
        reward(s, first, [0.0, 1.0])  # published, not yet read by the learner: in flight
        assert gauge(s, "gspo_groups_in_flight") == 2

        result: dict[str, httpx.Response] = {}
        held = threading.Thread(target=lambda: result.update(r=post(s, "/v1/rollouts",
                                                                    ROLLOUT, timeout=120)))
        held.start()
        wait_until(lambda: gauge(s, "gspo_admission_held") == 1, "the request to be held")
        time.sleep(0.3)  # held, not refused: nothing changed, so it is still waiting
        assert held.is_alive() and gauge(s, "gspo_admission_refused_total") == 0
        assert dashboard_queue(s)["requests_held"] == 1  # the dashboard says so too

        # The learner takes the published group: counted as being trained first (the real
        # learner publishes that as its read returns; a test that published it after the
        # read left a window in which the group counted nowhere and the held one went in)
        learner_publishes(url, tiny_model_dir, max_staleness=1, groups_per_step=1,
                          training=1)
        client = redis.Redis.from_url(url)
        batch = GroupReader(client, KEYS, max_staleness=1).read_batch(1, 0, timeout_s=5)
        assert len(batch.groups) == 1  # being trained: still in flight
        time.sleep(0.3)
        assert held.is_alive()
        learner_publishes(url, tiny_model_dir, max_staleness=1, groups_per_step=1,
                          training=0)  # trained: one group left its place
        held.join(timeout=60)
        assert not held.is_alive() and result["r"].status_code == 200, result
        assert gauge(s, "gspo_admission_held") == 0 == dashboard_queue(s)["requests_held"]
        assert gauge(s, "gspo_admission_waited_total") == 1
        reward(s, second, [1.0, 1.0])  # equal rewards: dropped by the server, and held by
        assert gauge(s, "gspo_groups_in_flight") == 2  # the sampling budget until a step
        learner_publishes(url, tiny_model_dir, max_staleness=1, groups_per_step=1, version=1)
        assert gauge(s, "gspo_groups_in_flight") == 1  # the learner stepped: its place is free
        client.close()


def test_groups_without_signal_hold_their_place_until_a_step_or_the_hold_ends(
        tiny_model_dir: Path, redis_server: RedisServer) -> None:
    """The sampling budget: groups that end with equal rewards count as in flight until a
    learner step or ``no_signal_hold_s`` has passed, but never more of them than leaves one
    step's groups free (the learner waiting for signal is never starved by the budget); the
    503 after the longest hold names the cause."""
    url = redis_server.url
    learner_publishes(url, tiny_model_dir, max_staleness=1, groups_per_step=2)  # bound 4
    with running_server(tiny_model_dir, url, admission=True, admission_wait_s=0.3,
                        no_signal_hold_s=8.0) as s:  # long enough for 5 requests on a busy box
        for _ in range(3):
            reward(s, sample(s), [1.0, 1.0])  # solved by every sample: dropped, no signal
        assert gauge(s, "gspo_groups_in_flight") == 2  # 3 held, 2 counted: 4 - 2 free
        live = [sample(s), sample(s)]  # one step's groups can always start
        refused = post(s, "/v1/rollouts", ROLLOUT)
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "3 ended without a learning signal since the learner's last step" in message
        assert "the sampling budget counts 2 of the 3" in message
        assert "the policy solves or fails every sample of most tasks" in message
        wait_until(lambda: gauge(s, "gspo_groups_in_flight") == 2, "the hold to end", 25)
        sample(s)  # admitted again
        for rollout in live:
            reward(s, rollout, [0.0, 1.0])
    with running_server(tiny_model_dir, url, admission=True, admission_wait_s=0.3,
                        no_signal_hold_s=0.0) as s:  # off: such a group leaves at once
        for _ in range(5):
            reward(s, sample(s), [0.0, 0.0])


def test_in_a_drought_every_held_group_counts_until_one_carries_a_signal(
        tiny_model_dir: Path, redis_server: RedisServer) -> None:
    """``no_signal_drought_s``: after that long with groups ending but none with a signal,
    the budget counts every held group (no place is left free), the 503 says why, and the
    first group with a signal frees the places again."""
    url = redis_server.url
    learner_publishes(url, tiny_model_dir, max_staleness=1, groups_per_step=2)  # bound 4
    with running_server(tiny_model_dir, url, admission=True, admission_wait_s=0.3,
                        no_signal_hold_s=60.0, no_signal_drought_s=20.0) as s:
        live = sample(s)
        r, now = redis.Redis.from_url(url), time.time()
        r.hset(KEYS.learner_state, "updated_at", now - 100)  # its last step: long ago
        # groups without a signal kept ending for 25 s (as the server records them)
        r.zadd(KEYS.no_signal, {"first": now - 25, **{f"g{i}": now - 1 for i in range(4)}})
        assert gauge(s, "gspo_groups_in_flight") == 1 + 5  # all five held groups count
        refused = post(s, "/v1/rollouts", ROLLOUT)
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "no group has carried a learning signal for 20 s (4 ended without one)" in message
        reward(s, live, [0.0, 1.0])  # a signal: the drought ends
        assert gauge(s, "gspo_groups_in_flight") == 1 + 2  # published unread + 4 - 2 held
        sample(s)
        r.close()


def test_refused_with_503_after_the_longest_hold_and_the_sdk_retries(
        tiny_model_dir: Path, redis_server: RedisServer) -> None:
    url = redis_server.url
    learner_publishes(url, tiny_model_dir, max_staleness=0, groups_per_step=1)  # bound 1
    with running_server(tiny_model_dir, url, admission=True, admission_wait_s=0.3) as s:
        blocking = sample(s)
        r = post(s, "/v1/groups", {"size": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_groups_in_flight"
        assert int(r.headers["Retry-After"]) >= 1

        async def sdk_call() -> dict[str, Any]:
            # Two attempts: without the admission retry the SDK would give up after one 503.
            async with AsyncGSPOClient(s.url, api_key=API_KEY,
                                       retry=RetryPolicy(attempts=2)) as c:
                return await c.open_group(2)

        async def main() -> dict[str, Any]:
            task = asyncio.create_task(sdk_call())
            while gauge(s, "gspo_admission_refused_total") < 3 and not task.done():
                await asyncio.sleep(0.1)
            assert not task.done()  # still retrying
            reward(s, blocking, [1.0, 1.0])  # the blocking group leaves (equal rewards)
            return await asyncio.wait_for(task, 60)

        opened = asyncio.run(main())
        assert len(opened["rollout_ids"]) == 2


@pytest.mark.parametrize("admission", [True, False])
def test_a_finished_learner_gets_no_new_group_and_its_groups_in_flight_finish(
        tiny_model_dir: Path, redis_server: RedisServer, admission: bool) -> None:
    """Once the learner met its target (``finished``, gspo_rl.learner.runtime.target) every
    route that starts a group answers 503 training_finished at once, with or without admission;
    rewards of the groups in flight are still taken. The server records what every finished group
    scored, equal-reward ones too (the target's measure), and the learner's synchronous in-flight
    count agrees with the server's. A learner that starts again lifts the refusal."""
    url = redis_server.url
    with running_server(tiny_model_dir, url, admission=admission, admission_wait_s=120) as s:
        first, second = sample(s), sample(s)
        client = redis.Redis.from_url(url)
        if admission:  # the server's published count of its requests lags by <= 1 s
            assert gauge(s, "gspo_groups_in_flight") == 2
            wait_until(lambda: groups_in_flight(client, KEYS) == 2, "the counts to agree")
        learner_publishes(url, tiny_model_dir, max_staleness=2, groups_per_step=4,
                          finished="target reward 0.8 reached at step 9")
        # A read of the learner's state may be reused for up to POLL_S (the gauge read above
        # may have cached one just before ``finished``); after that the refusal is immediate.
        time.sleep(2 * POLL_S)
        for path, body in (("/v1/rollouts", ROLLOUT), ("/v1/groups", {"size": 2})):
            r = post(s, path, body, timeout=10)  # at once, not after admission_wait_s
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "training_finished"
            assert "reached at step 9" in r.json()["error"]["message"]
            assert int(r.headers["Retry-After"]) >= 1
        reward(s, first, [0.0, 1.0])  # published
        reward(s, second, [1.0, 1.0])  # dropped: equal rewards
        totals = client.hgetall(KEYS.finished_rewards)
        assert totals == {b"groups": b"2", b"rewards": b"4", b"sum": b"3"}
        wait_until(lambda: groups_in_flight(client, KEYS) == 1,  # published, not yet read
                   "the published group alone in flight")
        learner_publishes(url, tiny_model_dir, max_staleness=2, groups_per_step=4)
        sample(s)  # a learner started again (``finished`` empty): new groups start
        client.close()


class _Coin(SingleTurnEnvironment):
    """Equal rewards on the first ``equal_plays`` plays of a task, then different ones."""

    group_size = 2
    sampling = {"max_tokens": 2}

    def __init__(self, equal_plays: int, resample: int) -> None:
        self.equal_plays = equal_plays
        self.resample_equal_rewards = resample
        self.plays = 0
        self.scored = 0

    def sample_task(self, rng: random.Random) -> int:
        return 0

    def prompt(self, task: int) -> str:
        self.plays += 1
        return "ab"

    def score(self, task: int, completion: str) -> float:
        self.scored += 1
        return 1.0 if self.plays <= self.equal_plays else float(self.scored % 2)


@pytest.mark.parametrize(("equal_plays", "resample", "plays", "kept"),
                         [(1, 2, 2, 0), (5, 2, 3, 1), (1, 0, 1, 1)])
def test_equal_reward_groups_are_resampled_when_asked(
        tiny_model_dir: Path, redis_server: RedisServer, equal_plays: int, resample: int,
        plays: int, kept: int) -> None:
    with running_server(tiny_model_dir, redis_server.url) as s:
        env = _Coin(equal_plays, resample)
        stats = RunStats()

        async def main() -> list[Any]:
            async with AsyncGSPOClient(s.url, api_key=API_KEY) as c:
                return await arun_groups(env, c, 1, stats=stats)

        [outcome] = asyncio.run(main())
        assert env.plays == plays and stats.resampled == plays - 1
        if resample:
            assert stats.equal_rewards_kept == kept
            assert outcome.fate == ("dropped:zero_variance" if kept else "published")
        else:
            assert outcome.fate is None  # not asked


def test_in_flight_count_recovers_from_a_crashed_server_and_a_crashed_learner(
        tiny_model_dir: Path, redis_server: RedisServer) -> None:
    url = redis_server.url
    # A learner died in the middle of a step of 3 groups; a server died holding 5 requests.
    learner_publishes(url, tiny_model_dir, max_staleness=1, groups_per_step=4, training=3)

    async def dead_server() -> None:
        client = redis.asyncio.Redis.from_url(url)
        await InFlightCounter(client, KEYS, "crashed").publish(5)
        await client.aclose()

    asyncio.run(dead_server())
    with running_server(tiny_model_dir, url, admission=True, admission_wait_s=0.2) as s:
        assert gauge(s, "gspo_groups_in_flight") == 8 and gauge(s, "gspo_admission_bound") == 8
        assert post(s, "/v1/rollouts", ROLLOUT).status_code == 503
        # The learner restarts and publishes its state: nothing in training.
        learner_publishes(url, tiny_model_dir, max_staleness=1, groups_per_step=4)
        assert gauge(s, "gspo_groups_in_flight") == 5
        # The crashed server's count expires with its key; the live one's own stays counted.
        wait_until(lambda: gauge(s, "gspo_groups_in_flight") == 0, "the dead server's count "
                   "to expire", timeout=PENDING_TTL_S + 10)
        for _ in range(8):
            sample(s)
        assert gauge(s, "gspo_groups_in_flight") == 8
        assert post(s, "/v1/rollouts", ROLLOUT).status_code == 503
        members = redis.Redis.from_url(url).zrange(KEYS.admission_seen, 0, -1)
        assert members == [b"test-server"]


def test_no_learner_is_said_in_those_words(tiny_model_dir: Path,
                                           redis_server: RedisServer) -> None:
    """A queue no learner reads: ``/health``, the 503 (at once, not after a hold) and
    ``gspo env`` say "no learner is connected" and what to do; the learner's heartbeat makes it
    connected, and its absence disconnected."""
    url = redis_server.url
    with running_server(tiny_model_dir, url, admission=True, admission_wait_s=0.2,
                        admission_capacity_without_learner=1) as s:
        learner = httpx.get(s.url + "/health", timeout=10).json()["learner"]
        assert learner["connected"] is False and learner["last_seen_s"] is None
        assert "no learner is connected (no learner has been seen yet)" in learner[
            "message"] and "gspo learn" in learner["message"]
        sample(s)  # the one place the fallback capacity allows
        refused = post(s, "/v1/rollouts", ROLLOUT)  # at once: holding it would help nothing
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "2"
        error = refused.json()["error"]
        assert error["code"] == "no_learner_connected", error
        assert "no learner is connected" in error["message"] and "1 open" in error["message"]
        said = gspo_env_says(s, "no learner is connected")
        assert "start one (gspo learn)" in said and "waiting for a learner" in said, said
        client = redis.Redis.from_url(url)
        beat = Heartbeat(client, KEYS).start()
        try:
            wait_until(lambda: httpx.get(s.url + "/health", timeout=10).json()["learner"][
                "connected"], "the heartbeat to be seen")
        finally:
            beat.stop()
        client.hset(KEYS.learner_state, "seen_at", "1")  # a learner gone long ago
        wait_until(lambda: not httpx.get(s.url + "/health", timeout=10).json()["learner"][
            "connected"], "an old heartbeat to read as gone")
        client.close()
