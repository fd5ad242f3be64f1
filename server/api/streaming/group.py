"""Incremental streaming of a group: the n samples' progress as SSE chunks, then the record.

``start_stream`` runs the pipeline of a non-streamed request up to the engine (the plan, every
limit checked, then the n samples, concurrently, seed + i each) and waits for the first
progress of any of them before answering, so every error before the first token is still a
JSON 4xx/5xx. The stream then sends, as tokens come, one chunk per choice that has new text
(what each chunk says is the route's ``ChunkView``, ``gspo_rl.server.api.streaming.sse``).
When every sample has ended, they are recorded exactly as non-streamed ones (``finish``), and
only then come each choice's final chunk, the usage chunk when asked, and ``[DONE]``.

An error after the response has started is one SSE event ``data: {"error": {...}}``, then
``[DONE]``; nothing is recorded. A client that leaves cancels the samples' tasks, which aborts
them in the engine. Design notes: docs/design/streaming.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from starlette.responses import StreamingResponse

from gspo_rl.server.api.errors import APIError, api_error_of
from gspo_rl.server.api.streaming.sse import sse, sse_response
from gspo_rl.server.api.streaming.views import as_partial
from gspo_rl.server.engines.sampler import Completion, Partial, SamplingEngine
from gspo_rl.server.rollouts.errors import RolloutError
from gspo_rl.server.rollouts.sampling import (
    GenerationPlan,
    GroupResult,
    check_not_aborted,
    engine_error,
    record_samples,
    sample_params,
    unrecorded_result,
)
from gspo_rl.server.rollouts.service import SamplingService

log = logging.getLogger(__name__)
Item = tuple[int, Partial | Completion | BaseException]


class ChunkView(Protocol):
    """What a route streams (``gspo_rl.server.api.streaming.sse``): chunk dicts of one choice
    each."""

    obj: str  # the chunks' ``object``
    id_prefix: str  # the response id's, before the group id

    def opening(self, n: int) -> list[dict[str, Any]]: ...

    def progress(self, index: int, partial: Partial) -> dict[str, Any] | None: ...

    def final(self, index: int, choice: Any) -> dict[str, Any]: ...


class GroupRun:
    """The n samples of a plan, their progress in one queue (index, item)."""

    def __init__(self, engine: SamplingEngine, plan: GenerationPlan) -> None:
        self.engine, self.plan = engine, plan
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []
        self.first: Item | None = None

    async def _pump(self, index: int, params: Any) -> None:
        try:
            stream = self.engine.generate_stream(self.plan.prompt_token_ids, params)
            async with contextlib.aclosing(stream) as items:
                async for item in items:
                    self.queue.put_nowait((index, item))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            self.queue.put_nowait((index, exc))

    async def start(self) -> None:
        """Starts the samples; returns at their first progress, raises their first error."""
        self.tasks = [asyncio.create_task(self._pump(i, p))
                      for i, p in enumerate(sample_params(self.plan))]
        self.first = await self.queue.get()
        if isinstance(self.first[1], BaseException):
            raise engine_error(self.first[1])

    async def batch(self) -> list[tuple[int, Partial | Completion]]:
        """What arrived since the last call (waits for something); raises a sample's error."""
        items = [self.first] if self.first is not None else [await self.queue.get()]
        self.first = None
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        out: list[tuple[int, Partial | Completion]] = []
        for index, item in items:
            if isinstance(item, BaseException):
                raise engine_error(item)
            out.append((index, item))
        return out

    async def close(self) -> None:
        """Cancels every sample still running (the engine drops them) and waits for them."""
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


Finish = Callable[[list[Completion]], Awaitable[Any]]
"""Records the finished samples and returns the non-streamed response object."""


async def start_stream(engine: SamplingEngine, plan: GenerationPlan, view: ChunkView, *,
                       group_id: str | None, model: str, finish: Finish,
                       with_usage: bool) -> StreamingResponse:
    """Starts the samples (errors: JSON), then answers with the SSE stream (module doc)."""
    run = GroupRun(engine, plan)
    try:
        await run.start()
    except BaseException:
        await run.close()
        raise
    head: dict[str, Any] = {"id": f"{view.id_prefix}{group_id or uuid.uuid4().hex}",
                            "object": view.obj,
                            "created": int(time.time()), "model": model, "group_id": group_id}
    if with_usage:
        head["usage"] = None
    return sse_response(_events(run, view, head, finish, plan.n))


async def stream_new_group(svc: SamplingService, plan: GenerationPlan, view: ChunkView,
                           build: Callable[[GroupResult], Any],
                           with_usage: bool) -> StreamingResponse:
    """A new group, streamed: recorded (``record_samples``) as a non-streamed one would be,
    unless ``plan.record`` is False. ``build``: the non-streamed response object."""
    started = time.perf_counter()
    # chosen now: every chunk names the group it will be
    group_id = uuid.uuid4().hex if plan.record else None

    async def finish(completions: list[Completion]) -> Any:
        check_not_aborted(completions)
        if group_id is None:
            return build(unrecorded_result(plan, completions, svc.metrics, started=started))
        return build(await record_samples(svc.store, plan, completions, svc.metrics,
                                          svc.settings.server_id, group_id=group_id,
                                          started=started))

    return await start_stream(svc.engine, plan, view, group_id=group_id,
                              model=svc.settings.model_name, finish=finish,
                              with_usage=with_usage)


async def _events(run: GroupRun, view: ChunkView, head: dict[str, Any],
                  finish: Finish, n: int) -> AsyncIterator[str]:
    try:
        for choice in view.opening(n):
            yield sse({**head, "choices": [choice]})
        finals: dict[int, Completion] = {}
        while len(finals) < n:
            latest: dict[int, Partial] = {}
            for index, item in await run.batch():
                if isinstance(item, Completion):  # its text so far, before the record
                    finals[index] = item
                    item = as_partial(item)
                latest[index] = item
            chunks = [sse({**head, "choices": [choice]}) for choice in
                      (view.progress(i, p) for i, p in latest.items()) if choice is not None]
            if chunks:
                yield "".join(chunks)  # one write for what arrived together
        response = await finish([finals[i] for i in range(n)])
        for c in response.choices:
            yield sse({**head, "choices": [view.final(c.index, c)]})
        if "usage" in head:
            yield sse({**head, "choices": [], "usage": response.usage.model_dump()})
    except Exception as exc:  # noqa: BLE001 - the response has started: an error event
        err = api_error_of(exc)
        if err.status >= 500 and not isinstance(exc, APIError | RolloutError):
            log.error("streamed request failed after its first byte", exc_info=exc)
        yield sse(err.body())
    finally:
        await run.close()
    yield sse("[DONE]")
