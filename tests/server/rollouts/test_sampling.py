"""``gspo_rl.server.rollouts.sampling.generate_n`` over the real hf engine: a one-sample request
awaits the engine directly, a group runs its samples as tasks; both map the engine's refusals alike
(``RequestRefused`` -> 400 invalid_request, a stopped engine -> 503 engine_unavailable) and
leave any other error of the engine's libraries as it is (a 500, never the client's fault); with
a seed sample i is sampled with seed + i either way."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gspo_rl.server.api.errors import api_error_of
from gspo_rl.server.engines.base import SamplingParams
from gspo_rl.server.engines.errors import EngineUnavailable, RequestRefused, WeightSyncFailed
from gspo_rl.server.engines.hf.engine import HFEngine
from gspo_rl.server.rollouts.errors import RolloutError
from gspo_rl.server.rollouts.sampling import GenerationPlan, generate_n

PROMPT = [5, 6, 7, 8]


def plan(n: int, prompt: list[int] = PROMPT, seed: int | None = 3) -> GenerationPlan:
    return GenerationPlan(prompt_token_ids=prompt, n=n, metadata={}, route="test",
                          params=SamplingParams(max_tokens=6, temperature=1.0, seed=seed))


async def _checks(path: Path) -> None:
    engine = HFEngine(str(path), max_batch_size=8)
    await engine.start()
    try:
        one = await generate_n(engine, plan(1))
        group = await generate_n(engine, plan(3))
        assert len(one) == 1 and len(group) == 3
        assert one[0].token_ids == group[0].token_ids  # sample 0: seed 3 both ways
        later = await generate_n(engine, plan(1, seed=5))
        assert later[0].token_ids == group[2].token_ids  # sample 2 of the group: seed 5
        for n in (1, 3):
            with pytest.raises(RolloutError) as refused:  # outside the vocabulary
                await generate_n(engine, plan(n, prompt=[engine.vocab_size]))
            assert api_error_of(refused.value).status_code == 400
            assert api_error_of(refused.value).body()["error"]["code"] == "invalid_request"
    finally:
        await engine.shutdown()
    for n in (1, 3):
        with pytest.raises(RolloutError) as stopped:
            await generate_n(engine, plan(n))
        assert api_error_of(stopped.value).status_code == 503
        assert api_error_of(stopped.value).body()["error"]["code"] == "engine_unavailable"


def test_one_sample_and_a_group_map_refusals_alike(tiny_model_dir: Path) -> None:
    asyncio.run(asyncio.wait_for(_checks(tiny_model_dir), 120))


class _Failing(HFEngine):
    """An engine whose library fails inside ``generate`` with a plain ValueError."""

    async def generate(self, prompt_token_ids, params):  # type: ignore[no-untyped-def]
        raise ValueError("an error of torch or transformers")


def test_a_library_error_inside_generate_is_no_client_error(tiny_model_dir: Path) -> None:
    engine = _Failing(str(tiny_model_dir), max_batch_size=2)
    for n in (1, 3):
        with pytest.raises((ValueError, ExceptionGroup)) as failed:  # a group: its tasks'
            asyncio.run(generate_n(engine, plan(n)))
        assert not isinstance(failed.value, RolloutError)
        assert api_error_of(failed.value).status_code == 500


def test_engine_errors_map_through_the_one_table() -> None:
    for exc, status in ((RequestRefused("x"), 400), (EngineUnavailable("x"), 503),
                        (WeightSyncFailed("x"), 504)):
        assert api_error_of(exc).status_code == status
    assert api_error_of(WeightSyncFailed("x")).body()["error"]["type"] == "weight_sync_error"
