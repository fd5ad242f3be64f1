"""``gspo_rl.server.rollouts.sampling.generate_n`` over the real hf engine: a one-sample request
awaits the engine directly, a group runs its samples as tasks; both map the engine's refusals alike
(ValueError -> 400 invalid_request, a stopped engine -> 503 engine_unavailable), and with a
seed sample i is sampled with seed + i either way."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gspo_rl.server.api.errors import api_error_of
from gspo_rl.server.engines.base import SamplingParams
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
