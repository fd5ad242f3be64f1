"""The sending side of the weight broadcast: the learner is rank 0, every live server's engine
takes the next ranks.

One push: (1) read the live servers from Redis (only registrations signed with the admin key,
``gspo_rl.redisq.registry``), leave out those whose ``/health`` does not answer, and
rebuild the group when the set changed or the last push failed (a fresh ``TCPStore``, every
server asked over HTTP to join epoch ``e``); (2) post ``/admin/weights/update`` to every
server while broadcasting the buckets; (3) drop a server whose call fails or times out,
rebuild the group without it and retry once. A server on the learner's own GPU gets CUDA IPC
handles (``/admin/weights/update_ipc``; ``contract.weights.collective.choose_transport``).

Every wait is bounded (HTTP by ``timeout_s``, collectives by the group's timeout, the health
check by ``health_timeout_s``) and ends early when a server's reply says its side failed
(``gspo_rl.learner.weights.replies``; the group is then abandoned); a wait past a few seconds
is reported through ``on_stall`` while it lasts. Redis being down fails the push
(``ok=False``, reason in ``error``) and never raises into the training loop. Design notes:
docs/design/weight-sync.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import redis
import torch
import torch.distributed as dist

from gspo_rl.contract.net import free_port
from gspo_rl.contract.schema import Keys
from gspo_rl.contract.weights.collective import (
    DEFAULT_BUCKET_BYTES,
    Backend,
    TransportInfo,
    choose_transport,
    device_ids,
    host_store,
    make_process_group,
    send_tensors,
    tensor_metas,
    transport_device,
)
from gspo_rl.contract.weights.cuda_ipc import IpcUpdateRequest, export_tensors
from gspo_rl.contract.weights.lora import LoraSpec
from gspo_rl.learner.weights.adapter import lora_payload
from gspo_rl.learner.weights.replies import Replies, StallFn, reply_error
from gspo_rl.redisq.registry import ServerInfo, read_registry

log = logging.getLogger(__name__)


def _warn_stall(detail: str) -> None:
    log.warning("%s", detail)


def _release(abandoned: list[tuple[float, dist.ProcessGroup]]) -> None:
    """Drop abandoned groups once their collectives have timed out (a daemon thread)."""
    while abandoned:
        until, _pg = abandoned.pop()
        time.sleep(max(0.0, until - time.monotonic()))


@dataclass
class BroadcastReport:
    """What one push did."""

    version: int
    servers: list[str] = field(default_factory=list)  # ids that loaded the version
    dropped: list[str] = field(default_factory=list)  # ids dropped during this push
    bytes_sent: int = 0
    seconds: float = 0.0
    rebuilt: bool = False
    ok: bool = False  # every live server that was kept loaded the version
    ipc_servers: list[str] = field(default_factory=list)  # ids reached by CUDA IPC handles
    rejected: list[str] = field(default_factory=list)  # registry entries that did not verify
    error: str = ""  # why the push failed before reaching any server (e.g. Redis down)
    lora: bool = False  # the push carried LoRA adapter tensors only


def named_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Hugging Face checkpoint names of the parameters to send.

    ``named_parameters`` lists a tied output layer once (as the input embedding): the engines
    re-tie on load. Buffers (rotary caches) are derived, never trained: not sent.
    """
    return [(n, p.detach()) for n, p in model.named_parameters()]


def push_payload(model: torch.nn.Module) -> tuple[list[tuple[str, torch.Tensor]],
                                                  LoraSpec | None]:
    """What a push sends: a LoRA model's adapter tensors and their spec
    (``gspo_rl.learner.weights.adapter``), else every weight and no spec."""
    payload = lora_payload(model)
    return payload if payload is not None else (named_weights(model), None)


class BroadcastSync:
    """Pushes the learner's weights to every live rollout server."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys = Keys(),
        *,
        admin_key: str | None = None,
        master_addr: str = "127.0.0.1",
        backend: Backend = "gloo",
        timeout_s: float = 60.0,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        device: torch.device | str | None = None,
        health_timeout_s: float = 3.0,
    ) -> None:
        """``device``: the learner's compute device (None: the pushed model's, or the current
        GPU when that model is a host copy, as under FSDP2). It sets where NCCL buckets are
        sent from and whether a server shares the learner's GPU."""
        self.client, self.keys = client, keys
        self.admin_key = admin_key
        self.health_timeout_s = min(health_timeout_s, timeout_s)
        self.master_addr, self.backend = master_addr, backend
        self.timeout_s, self.bucket_bytes = timeout_s, bucket_bytes
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s + 10))
        self.pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="weight-sync")
        self.members: list[ServerInfo] = []
        self.pg: dist.ProcessGroup | None = None
        self.epoch = 0
        self.device = None if device is None else torch.device(device)
        self._transports: dict[tuple[str, str], list[str]] = {}  # (id, url) -> device ids
        self._abandoned: list[tuple[float, dist.ProcessGroup]] = []  # (keep until, group)
        self._version = 0  # of the push under way
        self._join_refused: list[str] = []  # ids whose join failed in the last rebuild
        self.on_stall: StallFn = _warn_stall
        """Told, every few seconds while a wait of the push lasts, what it waits for (the
        learner records a ``stall``; by default a WARNING)."""

    # ---------------------------------------------------------------- group membership

    def _rebuild(self, servers: Sequence[ServerInfo]) -> bool:
        """New group over ``servers``. False if it did not form (a server never arrived)."""
        self.pg = None
        self.members = []
        if not servers:
            return True
        self.epoch += 1
        port = free_port("")  # the TCPStore: servers on other hosts connect
        world = 1 + sum(s.ranks for s in servers)
        store = host_store(self.master_addr, port, self.timeout_s)
        futures: list[tuple[ServerInfo, Future[httpx.Response]]] = []
        rank = 1
        for s in servers:
            body = {"master_addr": self.master_addr, "master_port": port, "rank": rank,
                    "world_size": world, "backend": self.backend, "epoch": self.epoch,
                    "timeout_s": self.timeout_s}
            futures.append((s, self.pool.submit(self.http.post, f"{s.url}/admin/weights/join",
                                                json=body)))
            rank += s.ranks
        replies = Replies("join", futures, self._version, self.on_stall)
        work = self.pool.submit(make_process_group, self.backend, self.master_addr, port, 0,
                                world, self.epoch, self.timeout_s, store=store)
        try:  # a server that fails to join ends the wait for the group at once
            pg = replies.race(work, self.timeout_s + 5, f"forming group epoch {self.epoch}")
        except Exception as exc:
            log.warning("weight group epoch %d failed to form: %s", self.epoch, exc)
            pg = None
        # Always collected (the log says who failed); once the group has failed, the joins
        # still waiting on it are not waited for: they end on their own timeout.
        joined = replies.collect(self.timeout_s + 15 if pg is not None else 0.0)
        self._join_refused = replies.failed()
        if pg is None or not joined:
            return False
        self.pg, self.members = pg, list(servers)
        return True

    def _unresponsive(self, servers: Sequence[ServerInfo]) -> list[str]:
        """After a failed round, the culprits: servers whose /health does not answer 200."""
        def healthy(s: ServerInfo) -> bool:
            try:
                return self.http.get(f"{s.url}/health",
                                     timeout=self.health_timeout_s).status_code == 200
            except httpx.HTTPError:
                return False

        verdicts = list(self.pool.map(healthy, servers))
        return [s.server_id for s, ok in zip(servers, verdicts, strict=True) if not ok]

    def _compute_device(self, model: torch.nn.Module) -> torch.device:
        if self.device is not None:
            return self.device
        # a LoRA host copy's frozen base is on the meta device (fsdp.load_host_copy)
        dev = next((p.device for p in model.parameters() if not p.is_meta), torch.device("cpu"))
        if dev.type == "cpu" and self.backend == "nccl" and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())  # a host copy (FSDP2)
        return dev

    def _server_devices(self, s: ServerInfo) -> list[str]:
        """The server's ``device_ids`` (asked once per server id and URL); [] if it cannot
        say (an older server, or one not answering): it then takes a broadcast rank."""
        key = (s.server_id, s.url)
        if key not in self._transports:
            try:
                resp = self.http.get(f"{s.url}/admin/weights/transport", timeout=10.0)
                resp.raise_for_status()
                self._transports[key] = TransportInfo.model_validate(resp.json()).devices
            except httpx.HTTPStatusError as exc:  # it answered: an older server, ask no more
                log.warning("server %s: no transport info (%s): using the broadcast",
                            s.server_id, exc)
                self._transports[key] = []
            except (httpx.HTTPError, ValueError) as exc:  # not reachable now: ask next push
                log.warning("server %s: no transport info (%s): using the broadcast",
                            s.server_id, exc)
                return []
        return self._transports[key]

    def split(self, servers: Sequence[ServerInfo], device: torch.device
              ) -> tuple[list[ServerInfo], list[ServerInfo]]:
        """(servers reached by CUDA IPC, servers in the broadcast group)."""
        mine = device_ids(device)
        if device.type != "cuda":  # IPC needs a GPU on both sides: no need to ask
            return [], list(servers)
        ipc = [s for s in servers
               if choose_transport(self.backend, mine, self._server_devices(s)) == "ipc"]
        return ipc, [s for s in servers if s not in ipc]

    # ---------------------------------------------------------------- push

    def push(self, model: torch.nn.Module, version: int) -> BroadcastReport:
        """Send ``model``'s weights as ``version`` to every live server (bounded in time).

        Up to three rounds: a round that fails drops the servers that stopped answering and
        rebuilds the group among the others.
        """
        t0 = time.perf_counter()
        report = BroadcastReport(version=version)
        self._version = version
        named, lora = push_payload(model)
        report.lora = lora is not None
        device = self._compute_device(model)
        excluded: set[str] = set()
        for _round in range(3):
            try:
                registry = read_registry(self.client, self.keys, self.admin_key,
                                         for_push=True)
            except redis.RedisError as exc:
                report.error = f"reading the server registry failed: {exc}"
                log.warning("weight push of version %d: %s", version, report.error)
                break
            report.rejected = sorted(registry.rejected)
            servers = [s for s in registry.servers if s.server_id not in excluded]
            # Health first: a dead server costs a few seconds here, not the full sync timeout.
            self._drop(self._unresponsive(servers), excluded, report)
            servers = [s for s in servers if s.server_id not in excluded]
            ipc, group = self.split(servers, device)
            if self.pg is None or [s.member() for s in group] != [
                    m.member() for m in self.members]:
                report.rebuilt = True
                if not self._rebuild(group):  # drop who refused to join, or does not answer
                    bad = self._join_refused + self._unresponsive(group)
                    self._drop(list(dict.fromkeys(bad)), excluded, report)
                    continue
            ipc_failed = self._send_ipc(named, version, ipc, device, lora, report)
            sent = not self.members or self._send(named, version, report, device, lora)
            if sent and not ipc_failed:
                report.servers = [m.server_id for m in self.members] + [s.server_id for s in ipc]
                report.ipc_servers, report.ok = [s.server_id for s in ipc], True
                break
            bad = self._unresponsive(ipc_failed)
            if not sent:
                bad += self._unresponsive(group)
                self._abandon()
            self._drop(bad, excluded, report)
        report.seconds = time.perf_counter() - t0
        return report

    @staticmethod
    def _drop(ids: list[str], excluded: set[str], report: BroadcastReport) -> None:
        for sid in ids:
            log.warning("dropping server %s from the weight broadcast", sid)
        excluded.update(ids)
        report.dropped.extend(ids)

    def _send_ipc(self, named: list[tuple[str, torch.Tensor]], version: int,
                  servers: Sequence[ServerInfo], device: torch.device,
                  lora: LoraSpec | None, report: BroadcastReport) -> list[ServerInfo]:
        """CUDA IPC handles of the weights (shared in place) to every server on our GPU;
        returns those that failed. This blocks until every server answered, and servers copy
        before they answer: nothing writes the weights while they are read."""
        if not servers:
            return []
        metas, kept, handles = export_tensors(named, device)
        body = IpcUpdateRequest(version=version, tensors=metas, handles=handles,
                                timeout_s=self.timeout_s, lora=lora).model_dump()
        report.bytes_sent += sum(m.nbytes for m in metas)  # what each server copies
        futures = [(s, self.pool.submit(self.http.post, f"{s.url}/admin/weights/update_ipc",
                                        json=body)) for s in servers]
        Replies("load IPC weights", futures, version, self.on_stall).collect(self.timeout_s + 15)
        failed = [s for s, fut in futures if not fut.done() or reply_error(fut) is not None]
        del kept
        torch.cuda.ipc_collect()  # release what the servers have let go of
        return failed

    def _send(self, named: list[tuple[str, torch.Tensor]], version: int,
              report: BroadcastReport, device: torch.device, lora: LoraSpec | None) -> bool:
        assert self.pg is not None
        metas = [m.model_dump() for m in tensor_metas(named)]
        body = {"epoch": self.epoch, "version": version, "tensors": metas,
                "bucket_bytes": self.bucket_bytes, "timeout_s": self.timeout_s,
                "lora": lora.model_dump() if lora is not None else None}
        futures = [(s, self.pool.submit(self.http.post, f"{s.url}/admin/weights/update",
                                        json=body)) for s in self.members]
        replies = Replies("load weights", futures, version, self.on_stall)
        try:  # each server's reply is read as it arrives: a failure aborts the broadcast
            report.bytes_sent += send_tensors(
                self.pg, named, self.bucket_bytes, self.timeout_s,
                transport_device(self.backend, device),
                poll=lambda: replies.poll("broadcasting the buckets"))
        except Exception as exc:
            log.warning("broadcast of version %d failed: %s", version, exc)
            self._abandon()
            return False
        return replies.collect(self.timeout_s + 15)

    def _abandon(self) -> None:
        """Leave the current group. NCCL: aborted (its kernels would spin on the GPU until
        the watchdog's timeout). Gloo: kept alive until its abandoned collective has timed
        out (gloo's abort does not end it, and dropping the group would block on it)."""
        now = time.monotonic()
        self._abandoned = [(t, pg) for t, pg in self._abandoned if t > now]
        if self.pg is not None and self.backend == "nccl":
            try:
                self.pg.abort()
            except Exception as exc:  # noqa: BLE001 - best effort: the group is left anyway
                log.warning("aborting weight group epoch %d: %s", self.epoch, exc)
        elif self.pg is not None:
            self._abandoned.append((now + self.timeout_s + 5, self.pg))
        self.pg, self.members = None, []

    def close(self) -> None:
        self.pg = None
        self.members = []
        if self._abandoned:  # dropped off the caller's thread: each blocks until timed out
            threading.Thread(target=_release, args=(self._abandoned,), daemon=True,
                             name="weight-sync-abandoned").start()
        self._abandoned = []
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()
