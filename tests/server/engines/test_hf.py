"""The transformers engine on the tiny model: sampling semantics, batching, pause / weight
updates, and log-probability parity with a plain forward pass (the learner's view)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TypeVar

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gspo_rl.server.engines.base import Completion, SamplingParams
from gspo_rl.server.engines.hf.engine import HFEngine
from gspo_rl.server.engines.hf.requests import ArrivalWindow
from tests.helpers.reference_logprobs import sequence_logprobs
from tests.helpers.waiting import until

T = TypeVar("T")
PROMPTS = [[5, 6, 7], list(range(10, 31)), [100], list(range(200, 212)), [42] * 7]


def run(coro: Awaitable[T], timeout: float = 120.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def started(path: Path, **kw: object) -> HFEngine:
    engine = HFEngine(str(path), **kw)  # type: ignore[arg-type]
    await engine.start()
    return engine


@contextlib.asynccontextmanager
async def running(path: Path, **kw: object) -> AsyncIterator[HFEngine]:
    """``started``, and shut down on leaving."""
    engine = await started(path, **kw)
    try:
        yield engine
    finally:
        await engine.shutdown()


async def batched(engine: HFEngine, prompts: list[list[int]], params: list[SamplingParams]
                  ) -> list[Completion]:
    """Submit all requests while paused, so they are guaranteed to share one batch."""
    await engine.pause()
    tasks = [asyncio.create_task(engine.generate(p, s)) for p, s in zip(prompts, params,
                                                                       strict=True)]
    await until(lambda: engine.stats().waiting == len(prompts))
    await engine.resume()
    return list(await asyncio.gather(*tasks))


def max_err(model: torch.nn.Module, prompt: list[int], out: Completion, temp: float) -> float:
    ref = sequence_logprobs(model, prompt + out.token_ids, len(prompt), temp)
    return max(abs(a - b) for a, b in zip(ref, out.logprobs, strict=True))


def perturbed(model: torch.nn.Module, names: list[str], seed: int
              ) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    return [(n, params[n].detach() + 0.05 * torch.randn(params[n].shape, generator=gen))
            for n in names]


# ---------------------------------------------------------------------- sampling semantics


def test_max_tokens_seed_and_greedy(tiny_model_dir: Path) -> None:
    async def body() -> None:
        async with running(tiny_model_dir) as engine:
            a = await engine.generate([1, 2, 3], SamplingParams(max_tokens=9, seed=11))
            b = await engine.generate([1, 2, 3], SamplingParams(max_tokens=9, seed=11))
            c = await engine.generate([1, 2, 3], SamplingParams(max_tokens=9, seed=12))
            assert a.finish_reason == "length" and len(a.token_ids) == 9
            assert len(a.logprobs) == len(a.policy_versions) == 9 and a.top_logprobs is None
            assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs)
            assert a.token_ids != c.token_ids
            # the same seed gives the same tokens inside a batch of other requests
            outs = await batched(engine, [[1, 2, 3]] + PROMPTS, [
                SamplingParams(max_tokens=9, seed=11 if i == 0 else i) for i in range(6)])
            assert outs[0].token_ids == a.token_ids
            greedy = SamplingParams(max_tokens=6, temperature=0.0)
            g1, g2 = await engine.generate([4, 5], greedy), await engine.generate([4, 5], greedy)
            assert g1.token_ids == g2.token_ids
            assert engine.model is not None
            with torch.no_grad():
                ids = torch.tensor([[4, 5] + g1.token_ids], device=engine.device)
                logits = engine.model(input_ids=ids).logits[0, 1:-1]
            assert logits.argmax(-1).tolist() == g1.token_ids
            assert max_err(engine.model, [4, 5], g1, 1.0) < 1e-4  # greedy: reported at T = 1
    run(body())


def test_stop_token_ids_and_stop_strings(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    async def body() -> None:
        async with running(tiny_model_dir) as engine:
            greedy = SamplingParams(max_tokens=12, temperature=0.0)
            ref = (await engine.generate([9, 8, 7], greedy)).token_ids
            stop_id = ref[4]
            out = await engine.generate([9, 8, 7], SamplingParams(
                max_tokens=12, temperature=0.0, stop_token_ids=(stop_id,)))
            assert out.finish_reason == "stop" and out.stop_string is None
            assert out.token_ids == ref[: ref.index(stop_id) + 1]  # the stop token is kept
            text = tok.decode(ref[:5])
            stop = text[-2:]
            first = next(j for j in range(1, 13) if stop in tok.decode(ref[:j]))
            out = await engine.generate([9, 8, 7], SamplingParams(
                max_tokens=12, temperature=0.0, stop=("never-there", stop)))
            assert out.finish_reason == "stop" and out.stop_string == stop
            assert out.token_ids == ref[:first]
    run(body())


def test_top_logprobs_top_k_top_p(tiny_model_dir: Path) -> None:
    async def body() -> None:
        async with running(tiny_model_dir) as engine:
            greedy = await engine.generate([3, 1, 4], SamplingParams(max_tokens=8,
                                                                     temperature=0.0))
            k1 = await engine.generate([3, 1, 4], SamplingParams(max_tokens=8, top_k=1, seed=5))
            p0 = await engine.generate([3, 1, 4], SamplingParams(max_tokens=8, top_p=1e-6,
                                                                 seed=6))
            assert k1.token_ids == greedy.token_ids == p0.token_ids
            # log-probabilities are those of the truncated, renormalised distribution: with
            # one token kept, log 1 = 0 (they used to be those before truncation)
            assert engine.logprobs_after_truncation
            assert k1.logprobs == p0.logprobs == pytest.approx([0.0] * 8, abs=1e-6)
            cut = await engine.generate([3, 1, 4], SamplingParams(
                max_tokens=4, top_k=2, top_logprobs=5, seed=2))
            assert cut.top_logprobs is not None
            assert all(len(top) == 2 for top in cut.top_logprobs)  # cut tokens are not listed
            out = await engine.generate([3, 1, 4], SamplingParams(
                max_tokens=8, temperature=0.7, top_logprobs=3, seed=1))
            assert out.top_logprobs is not None and len(out.top_logprobs) == 8
            for tok, lp, top in zip(out.token_ids, out.logprobs, out.top_logprobs, strict=True):
                values = [v for _, v in top]
                assert len(top) == 3 and values == sorted(values, reverse=True)
                assert lp <= values[0] + 1e-6
                if tok in dict(top):
                    assert dict(top)[tok] == pytest.approx(lp, abs=1e-6)
    run(body())


def test_max_model_len_and_bad_input(tiny_model_dir: Path) -> None:
    async def body() -> None:
        async with running(tiny_model_dir, max_model_len=16) as engine:
            out = await engine.generate(list(range(1, 11)), SamplingParams(max_tokens=100))
            assert out.finish_reason == "length" and len(out.token_ids) == 6
            for prompt, params in [([], SamplingParams()), ([5000], SamplingParams()),
                                   (list(range(16)), SamplingParams()),
                                   ([1], SamplingParams(temperature=-1)),
                                   ([1], SamplingParams(top_p=0)),
                                   ([1], SamplingParams(max_tokens=0))]:
                with pytest.raises(ValueError):
                    await engine.generate(prompt, params)
            assert engine.stats().running == engine.stats().waiting == 0
    run(body())


# ---------------------------------------------------------------------- batching and control


def test_concurrent_requests_share_a_batch_and_cap(tiny_model_dir: Path) -> None:
    async def body() -> None:
        async with running(tiny_model_dir, max_batch_size=3) as engine:
            outs = await batched(engine, PROMPTS, [SamplingParams(max_tokens=5, seed=i)
                                                   for i in range(5)])
            assert all(len(o.token_ids) == 5 for o in outs)
            assert engine.stats().extra["max_batch_size_observed"] == 3  # capped
        async with running(tiny_model_dir) as engine:
            await batched(engine, PROMPTS, [SamplingParams(max_tokens=5) for _ in PROMPTS])
            extra = engine.stats().extra
            assert extra["max_batch_size_observed"] == len(PROMPTS)
            assert extra["prefills"] == 1 and extra["decode_steps"] == 4
    run(body())


def test_refills_trickling_in_are_coalesced_into_one_prefill(tiny_model_dir: Path) -> None:
    """A batch of 4 ends together; its 4 replacements arrive one by one (as over HTTP) and
    are admitted in one prefill, sampling the same tokens as each request alone."""
    seeds = [SamplingParams(max_tokens=6, seed=10 + i) for i in range(4)]
    generous = ArrivalWindow(min_gap_s=30.0, max_gap_s=30.0, max_window_s=60.0)

    async def body() -> None:
        async with running(tiny_model_dir, arrival_window=generous) as engine:
            alone = [await engine.generate(p, s) for p, s in zip(PROMPTS[:4], seeds, strict=True)]
            await batched(engine, PROMPTS[:4], [SamplingParams(max_tokens=3)] * 4)
            before = dict(engine.stats().extra)
            tasks = []
            for prompt, params in zip(PROMPTS[:4], seeds, strict=True):
                tasks.append(asyncio.create_task(engine.generate(prompt, params)))
                await asyncio.sleep(0.01)
            refill = await asyncio.gather(*tasks)
            extra = engine.stats().extra
            assert extra["prefills"] - before["prefills"] == 1
            assert extra["coalesce_waits"] - before["coalesce_waits"] == 1
            for one, many in zip(alone, refill, strict=True):
                assert many.token_ids == one.token_ids
                assert many.logprobs == pytest.approx(one.logprobs, abs=1e-4)
    run(body())


def test_a_lone_refill_waits_one_bounded_window(tiny_model_dir: Path) -> None:
    """When fewer replacements come than requests ended, the engine stops waiting for them
    (default bounds: a few steps' time) and does not wait for them again."""
    async def body() -> None:
        async with running(tiny_model_dir) as engine:
            await batched(engine, PROMPTS[:4], [SamplingParams(max_tokens=3)] * 4)
            first = await engine.generate(PROMPTS[0], SamplingParams(max_tokens=3, seed=1))
            second = await engine.generate(PROMPTS[1], SamplingParams(max_tokens=3, seed=2))
            assert len(first.token_ids) == len(second.token_ids) == 3
            assert engine.stats().extra["coalesce_waits"] == 1  # the first, not the second
    run(body())


def test_pause_resume_and_cancel(tiny_model_dir: Path) -> None:
    async def body() -> None:
        async with running(tiny_model_dir) as engine:
            task = asyncio.create_task(engine.generate([1, 2], SamplingParams(max_tokens=300)))
            await until(lambda: engine.stats().running == 1)
            await engine.pause()
            steps = engine.stats().extra["decode_steps"]
            await asyncio.sleep(0.2)
            assert engine.stats().extra["decode_steps"] == steps and not task.done()
            await engine.resume()
            assert len((await task).token_ids) == 300
            doomed = asyncio.create_task(engine.generate([1], SamplingParams(max_tokens=1500)))
            await until(lambda: engine.stats().running == 1)
            doomed.cancel()
            await until(lambda: engine.stats().running == 0)
            assert doomed.cancelled()
    run(body())


def test_shutdown_aborts_in_flight(tiny_model_dir: Path) -> None:
    async def body() -> None:
        engine = await started(tiny_model_dir)
        task = asyncio.create_task(engine.generate([1, 2], SamplingParams(max_tokens=1500)))
        await until(lambda: engine.stats().running == 1)
        await engine.shutdown()
        out = await task
        assert out.finish_reason == "abort" and len(out.token_ids) < 1500
        with pytest.raises(RuntimeError):
            await engine.generate([1], SamplingParams())
    run(body())


# ---------------------------------------------------------------------- log-probability parity


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_logprob_parity_batched(tiny_model_dir: Path, tiny_model_untied_dir: Path, tied: bool,
                                temp: float) -> None:
    path = tiny_model_dir if tied else tiny_model_untied_dir
    ref_model = AutoModelForCausalLM.from_pretrained(path).eval()

    async def body() -> None:
        async with running(path) as engine:
            outs = await batched(engine, PROMPTS, [
                SamplingParams(max_tokens=8 + 3 * i, temperature=temp, seed=i)
                for i in range(len(PROMPTS))])
            for prompt, out in zip(PROMPTS, outs, strict=True):
                assert max_err(ref_model, prompt, out, temp) < 1e-4
            # a request joining a running batch (shorter, then longer than its cache)
            done = engine.stats().extra["tokens_generated"]
            long = asyncio.create_task(engine.generate([7, 7], SamplingParams(
                max_tokens=300, temperature=temp, seed=1)))
            await until(lambda: engine.stats().extra["tokens_generated"] >= done + 5)
            joiners = [[3], list(range(40, 90))]
            extra = await batched(engine, joiners, [SamplingParams(
                max_tokens=10, temperature=temp, seed=9)] * 2)
            assert not long.done()  # they joined the running batch and left it first
            first = await long
            assert len(first.token_ids) == 300
            assert engine.stats().extra["max_batch_size_observed"] == len(PROMPTS)
            assert max_err(ref_model, [7, 7], first, temp) < 1e-4
            for prompt, out in zip(joiners, extra, strict=True):
                assert max_err(ref_model, prompt, out, temp) < 1e-4
    run(body())


@pytest.mark.parametrize("tied", [True, False])
def test_load_weights_versions_and_parity(tiny_model_dir: Path, tiny_model_untied_dir: Path,
                                          tied: bool) -> None:
    path = tiny_model_dir if tied else tiny_model_untied_dir
    ref_old = AutoModelForCausalLM.from_pretrained(path).eval()
    ref_new = AutoModelForCausalLM.from_pretrained(path).eval()
    names = (["model.embed_tokens.weight"] if tied else
             [n for n, _ in ref_new.named_parameters()])
    update = perturbed(ref_new, names, seed=0)
    with torch.no_grad():
        params = dict(ref_new.named_parameters())
        for n, t in update:
            params[n].copy_(t)
    greedy = SamplingParams(max_tokens=10, temperature=0.0)

    async def body() -> None:
        async with running(path) as engine:
            before = await engine.generate([1, 2, 3], greedy)
            inflight = asyncio.create_task(engine.generate([5, 5], SamplingParams(
                max_tokens=200, temperature=0.7, seed=2)))
            await until(lambda: engine.stats().extra["tokens_generated"] >= 13)
            await engine.pause()
            await engine.load_weights(iter(update), version=1)
            await engine.resume()
            assert engine.policy_version == 1
            after = await engine.generate([1, 2, 3], greedy)
            mixed = await inflight
            assert engine.stats().extra["cache_recomputes"] == 1  # the in-flight request's
            assert engine.model is not None
            if tied:  # the output layer followed the embedding
                assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight
                assert torch.equal(engine.model.lm_head.weight.cpu(), update[0][1])
            assert before.policy_versions == [0] * 10 and after.policy_versions == [1] * 10
            assert before.token_ids != after.token_ids
            assert max_err(ref_old, [1, 2, 3], before, 1.0) < 1e-4
            assert max_err(ref_new, [1, 2, 3], after, 1.0) < 1e-4
            versions = mixed.policy_versions
            split = versions.index(1)
            assert split > 0 and versions == [0] * split + [1] * (200 - split)
            seq = [5, 5] + mixed.token_ids
            old_lp = sequence_logprobs(ref_old, seq, 2, 0.7)[:split]
            new_lp = sequence_logprobs(ref_new, seq, 2, 0.7)[split:]
            assert mixed.logprobs == pytest.approx(old_lp + new_lp, abs=1e-4)
            with pytest.raises(KeyError):
                await engine.load_weights([("no.such.weight", torch.zeros(1))], version=2)
            with pytest.raises(ValueError):
                await engine.load_weights([(names[0], torch.zeros(3))], version=2)
            assert engine.policy_version == 1
    run(body())
