"""The SDK's errors are named by what happened and carry the server's ``code``, ``status`` and
``message`` (gspo_rl.client.errors): the mapping itself, then real answers of the rewards API (real
uvicorn, real Redis) surfacing through ``GSPOClient`` as the right exception."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gspo_rl.client import (
    AsyncGSPOClient,
    ConflictError,
    GroupExpired,
    GSPOClient,
    GSPOError,
    NotFound,
    NotFoundError,
    RequestRejected,
    RewardAlreadySet,
    RewardConflict,
    ServerUnavailable,
    UnprocessableEntityError,
)
from gspo_rl.client.client import RetryPolicy
from gspo_rl.client.errors import (
    AuthenticationError,
    BadRequestError,
    ConcurrentTurn,
    EpisodeFinished,
    EpisodeSettingsChanged,
    HistoryMismatch,
    InternalServerError,
    RateLimitError,
    error_for_status,
)
from tests.conftest import RedisServer
from tests.helpers.queue import ApiServer, open_group


def _body(code: str | None, message: str = "why") -> dict[str, object]:
    return {"error": {"message": message, "type": "x", "code": code}}


@pytest.mark.parametrize(("status", "code", "cls"), [
    (400, "invalid_messages", BadRequestError),
    (401, "invalid_api_key", AuthenticationError),
    (404, "unknown_rollout", NotFoundError),
    (409, "conflict", RewardAlreadySet),
    (409, "history_mismatch", HistoryMismatch),
    (409, "history_rewritten", HistoryMismatch),
    (409, "tools_changed", EpisodeSettingsChanged),
    (409, "sampling_changed", EpisodeSettingsChanged),
    (409, "concurrent_turn", ConcurrentTurn),
    (409, "episode_finished", EpisodeFinished),
    (409, "group_exists", ConflictError),
    (410, "expired", GroupExpired),
    (422, "turn_count_mismatch", UnprocessableEntityError),
    (429, "ready_queue_full", RateLimitError),
    (418, None, RequestRejected),
])
def test_status_and_code_pick_the_exception(status: int, code: str | None,
                                            cls: type[GSPOError]) -> None:
    exc = error_for_status(status, _body(code, "the server's words"))
    assert type(exc) is cls
    assert (exc.status, exc.code, exc.message) == (status, code, "the server's words")
    assert str(exc) == f"HTTP {status}: the server's words"
    assert isinstance(exc, RequestRejected)


def test_old_names_catch_what_they_always_caught() -> None:
    """Environment code written against ``RewardConflict`` / ``NotFound`` keeps working:
    every 409 (whatever its code) is still a ``RewardConflict``, every 404 a ``NotFound``."""
    for code in ("conflict", "history_mismatch", "concurrent_turn", "not_an_episode"):
        assert isinstance(error_for_status(409, _body(code)), RewardConflict)
    assert isinstance(error_for_status(404, _body("unknown_group")), NotFound)
    assert not isinstance(error_for_status(409, _body("conflict")), NotFound)


def test_5xx_and_text_bodies() -> None:
    exc = error_for_status(500, "boom")
    assert isinstance(exc, InternalServerError) and isinstance(exc, ServerUnavailable)
    assert (exc.status, exc.code, exc.message, exc.status_code) == (500, None, "boom", 500)
    assert not isinstance(exc, RequestRejected)


@pytest.fixture
def api(redis_server: RedisServer) -> Iterator[ApiServer]:
    server = ApiServer(redis_server.url)
    yield server
    server.close()


def test_server_errors_surface_with_their_code(api: ApiServer) -> None:
    ids = api.run(open_group(api.store, "g-err", 2))
    with GSPOClient(api.url, retry=RetryPolicy(attempts=1)) as client:
        client.post_reward(ids[0], 1.0)
        with pytest.raises(RewardAlreadySet) as conflict:
            client.post_reward(ids[0], 0.0)
        assert (conflict.value.status, conflict.value.code) == (409, "conflict")
        assert "different reward" in conflict.value.message
        with pytest.raises(NotFoundError) as missing:
            client.post_reward("no-such-rollout", 1.0)
        assert (missing.value.status, missing.value.code) == (404, "unknown_rollout")
        with pytest.raises(UnprocessableEntityError) as invalid:
            client.post_rewards([{"rollout_id": ids[1], "reward": 1e10}])
        assert invalid.value.status == 422 and invalid.value.code is not None


def test_async_client_raises_the_same(api: ApiServer) -> None:
    ids = api.run(open_group(api.store, "g-err-async", 2))

    async def main() -> None:
        async with AsyncGSPOClient(api.url, retry=RetryPolicy(attempts=1)) as client:
            await client.post_reward(ids[0], 1.0)
            with pytest.raises(RewardConflict) as conflict:
                await client.post_reward(ids[0], 0.5)
            assert type(conflict.value) is RewardAlreadySet
            assert conflict.value.code == "conflict"

    asyncio.run(main())
