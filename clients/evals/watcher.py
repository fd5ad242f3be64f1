"""Evaluation during training: run an eval set every ``every`` policy versions, next to the
environment that feeds the learner.

``EvalWatcher.run`` polls the server's ``/health`` for its policy version; at the first version
it sees (the baseline) and then whenever the version reaches the next multiple of ``every``
(0, 5, 10, ...; one the learner passed during an evaluation is not made up), it runs
``evaluate`` (unrecorded requests: the training traffic is neither counted
nor held back by them) and posts the result to ``POST /v1/evals``, whence the learner logs it
with its step metrics. Each report also goes to ``on_report`` and, as one JSON line without the
answers, to ``out``. A failed evaluation (the server restarting, a verifier raising) is logged
with its reason and that version is skipped (the next is due ``every`` versions on); waiting
on an unreachable server says so every 30 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from gspo_rl.client.client import AsyncGSPOClient
from gspo_rl.client.environment import MultiTurnEnvironment, SingleTurnEnvironment
from gspo_rl.client.errors import GSPOError
from gspo_rl.client.evals.runner import EvalReport, evaluate

log = logging.getLogger(__name__)
WARN_EVERY_S = 30.0


class EvalWatcher:
    def __init__(self, env: SingleTurnEnvironment | MultiTurnEnvironment, tasks: Sequence[Any],
                 *, name: str = "eval", every: int = 10, samples: int = 4,
                 ks: Sequence[int] = (1,), sampling: dict[str, Any] | None = None,
                 concurrency: int = 8, poll_s: float = 2.0,
                 on_report: Callable[[EvalReport], None] | None = None,
                 out: Path | None = None, post: bool = True) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.env, self.tasks, self.name, self.every = env, list(tasks), name, every
        self.samples, self.ks, self.sampling = samples, list(ks), sampling
        self.concurrency, self.poll_s = concurrency, poll_s
        self.on_report, self.out, self.post = on_report, out, post
        self.reports: list[EvalReport] = []
        self.next_due: int | None = None
        self._warned_at = -WARN_EVERY_S

    async def run_final(self, client: AsyncGSPOClient,
                        trained: int | None = None) -> EvalReport | None:
        """The evaluation after training: ``run_once``, unless the latest one already
        evaluated the version the server now holds (None then). ``trained``: the version the
        learner trained last; the evaluation first waits for the server to hold it (its push
        may still be on the way), saying so every ``WARN_EVERY_S`` (the caller bounds it)."""
        version = await self._version(client)
        waited_at = time.monotonic()
        while trained is not None and (version is None or version < trained):
            if time.monotonic() - waited_at >= WARN_EVERY_S:
                waited_at = time.monotonic()
                log.warning("the final evaluation waits for the server to hold version %d (it "
                            "holds %s): the learner's last push has not reached it", trained,
                            version)
            await asyncio.sleep(min(self.poll_s, 0.5))
            version = await self._version(client)
        if self.reports and version is not None and self.reports[-1].newest_version == version:
            return None
        return await self.run_once(client)

    async def run_once(self, client: AsyncGSPOClient) -> EvalReport:
        """Evaluate now, post and record the result."""
        report = await evaluate(self.env, client, self.tasks, name=self.name,
                                samples=self.samples, ks=self.ks, sampling=self.sampling,
                                concurrency=self.concurrency)
        if self.post:
            await client.post_eval(self.name, report.policy_version, report.metrics,
                                   {"newest_version": report.newest_version,
                                    "seconds": round(report.seconds, 3)})
        self.reports.append(report)
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            with self.out.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"time": time.time(),
                                    **report.to_dict(with_results=False)}) + "\n")
        if self.on_report is not None:
            self.on_report(report)
        log.info("%s", report.line())
        return report

    async def _version(self, client: AsyncGSPOClient) -> int | None:
        try:
            return int((await client.health())["policy_version"])
        except (GSPOError, httpx.HTTPError, KeyError, ValueError) as exc:
            now = time.monotonic()
            if now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                log.warning("evaluation waits for the server: %s", exc)
            return None

    async def run(self, client: AsyncGSPOClient, stop: asyncio.Event) -> list[EvalReport]:
        """Until ``stop`` is set: evaluate whenever a version is due (module docstring)."""
        while not stop.is_set():
            version = await self._version(client)
            if version is not None and (self.next_due is None or version >= self.next_due):
                try:
                    report = await self.run_once(client)
                    # the next multiple of ``every`` (0, 5, 10, ...): versions the learner
                    # passed while an evaluation ran are not made up later
                    self.next_due = (report.policy_version // self.every + 1) * self.every
                except Exception as exc:  # noqa: BLE001 - an evaluation must not end the run
                    self.next_due = version + self.every
                    log.warning("evaluation %s at version %d failed (next at version %d): "
                                "%s: %s", self.name, version, self.next_due,
                                type(exc).__name__, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)
        return self.reports


class Watchers:
    """Several eval sets (one per environment of a mix), watched side by side: the same
    ``run`` / ``run_once`` / ``reports`` as one ``EvalWatcher``."""

    def __init__(self, watchers: Sequence[EvalWatcher]) -> None:
        self.watchers = list(watchers)

    @property
    def reports(self) -> list[EvalReport]:
        return [r for w in self.watchers for r in w.reports]

    async def run_once(self, client: AsyncGSPOClient) -> list[EvalReport]:
        return [await w.run_once(client) for w in self.watchers]

    async def run_final(self, client: AsyncGSPOClient,
                        trained: int | None = None) -> list[EvalReport | None]:
        return [await w.run_final(client, trained) for w in self.watchers]

    async def run(self, client: AsyncGSPOClient, stop: asyncio.Event) -> list[EvalReport]:
        await asyncio.gather(*(w.run(client, stop) for w in self.watchers))
        return self.reports
