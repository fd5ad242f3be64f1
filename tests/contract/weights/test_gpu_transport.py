"""Where weight-transfer buffers live, and the one-GPU CUDA IPC path.

CPU tests check the device plumbing (the device every rank receives into, chosen in one place)
with the NCCL process group replaced at its boundary (NCCL cannot run here), the IPC control
messages and the transport choice. ``gpu`` tests run the real CUDA paths: NCCL into an
engine's GPU (two GPUs), CUDA IPC between processes on one GPU, the hf engine on CUDA.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from gspo_rl.contract.weights.collective import (
    JoinRequest,
    UpdateRequest,
    choose_transport,
    tensor_metas,
    transport_device,
)
from gspo_rl.contract.weights.cuda_ipc import (
    CudaIpcTensor,
    IpcUpdateRequest,
    check_request,
    handle_message,
    open_tensors,
    rebuild_args,
)
from gspo_rl.server.engines.base import Completion, Engine, EngineStats, SamplingParams
from tests.helpers.serving import ADMIN_KEY, running_server

GPU_A, GPU_B = "GPU-aaaa", "GPU-bbbb"


def _named(device: str | torch.device = "cpu") -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [("a.weight", torch.randn(64, 32, generator=g).to(device)),
            ("a.bias", torch.randn(32, generator=g).to(device)),
            ("b.half", torch.randn(16, 8, generator=g).to(torch.bfloat16).to(device))]


# ------------------------------------------------------------------ the device, in one place

def test_transport_device_nccl_uses_the_ranks_gpu_and_gloo_the_host() -> None:
    assert transport_device("nccl", "cuda:1") == torch.device("cuda", 1)
    assert transport_device("nccl", torch.device("cuda", 3)) == torch.device("cuda", 3)
    for dev in ("cpu", "cuda:1", torch.device("meta")):
        assert transport_device("gloo", dev) == torch.device("cpu")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        transport_device("nccl", "cpu")


class _RecordingEngine(Engine):
    """The smallest engine: records what it is asked to load (the hf engine needs a model)."""

    name, model_path, max_model_len = "rec", "-", 16

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.loaded: list[tuple[str, torch.Tensor]] = []
        self.version = 0

    @property
    def policy_version(self) -> int:
        return self.version

    async def start(self) -> None: ...
    async def shutdown(self) -> None: ...
    async def pause(self) -> None: ...
    async def resume(self) -> None: ...

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams
                       ) -> Completion:
        raise NotImplementedError

    async def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                           version: int) -> None:
        self.loaded, self.version = list(weights), version

    def stats(self) -> EngineStats:
        return EngineStats()


@pytest.mark.parametrize(("backend", "engine_device", "want"), [
    ("nccl", torch.device("cuda", 1), torch.device("cuda", 1)),
    ("gloo", torch.device("cuda", 1), torch.device("cpu")),
    ("gloo", torch.device("cpu"), torch.device("cpu")),
])
def test_engine_receives_into_the_transport_device(monkeypatch: pytest.MonkeyPatch,
                                                   backend: str, engine_device: torch.device,
                                                   want: torch.device) -> None:
    """Finding 1: the receive buckets were always on the CPU (NCCL: "Tensors must be CUDA and
    dense"). The process group is replaced at its boundary; the device argument is what
    counts."""
    import gspo_rl.contract.weights.collective as wt

    seen: dict[str, Any] = {}
    monkeypatch.setattr(wt, "make_process_group", lambda *a, **k: object())

    def fake_receive(pg: Any, metas: Any, bucket_bytes: int, timeout_s: float,
                     device: Any = "cpu") -> Any:
        seen["device"] = torch.device(device)
        return iter([("x", torch.zeros(2))])

    monkeypatch.setattr(wt, "receive_tensors", fake_receive)
    engine = _RecordingEngine(engine_device)
    join = JoinRequest(master_addr="127.0.0.1", master_port=1, rank=1, world_size=2,
                       backend=backend, epoch=4)  # type: ignore[arg-type]
    update = UpdateRequest(epoch=4, version=7, tensors=tensor_metas([("x", torch.zeros(2))]))

    async def body() -> None:
        await engine.join_weight_group(join)
        await engine.receive_weights(update, timeout_s=5)

    asyncio.run(body())
    assert seen["device"] == want
    assert engine.version == 7 and [n for n, _ in engine.loaded] == ["x"]


# ------------------------------------------------------------------ choosing the transport

def test_choose_transport_ipc_only_on_the_learners_own_gpu() -> None:
    assert choose_transport("nccl", [GPU_A], [GPU_A]) == "ipc"
    assert choose_transport("gloo", [GPU_A], [GPU_A]) == "ipc"
    assert choose_transport("nccl", [GPU_A], [GPU_B]) == "nccl"
    assert choose_transport("gloo", ["cpu"], ["cpu"]) == "gloo"
    assert choose_transport("gloo", [GPU_A], ["cpu"]) == "gloo"
    assert choose_transport("nccl", [GPU_A], []) == "nccl"  # a server that cannot say
    # a server spread over several GPUs takes broadcast ranks (one per worker)
    assert choose_transport("nccl", [GPU_A], [GPU_B, GPU_A]) == "nccl"


def test_learner_on_cpu_never_asks_servers_for_ipc() -> None:
    from gspo_rl.learner.weights.broadcast import BroadcastSync
    from gspo_rl.redisq.registry import ServerInfo

    sync = BroadcastSync(client=None, backend="gloo")  # type: ignore[arg-type]
    try:
        s = ServerInfo(server_id="s", url="http://127.0.0.1:9", engine="hf", model="m",
                       ranks=1)
        assert sync.split([s], torch.device("cpu")) == ([], [s])
        assert sync._transports == {}  # no HTTP call was made
    finally:
        sync.close()


# ------------------------------------------------------------------ IPC messages (pure)

def _fake_share(seed: int) -> tuple:
    """The shape of ``UntypedStorage._share_cuda_()``'s tuple, with arbitrary bytes."""
    g = torch.Generator().manual_seed(seed)
    raw = bytes(torch.randint(0, 256, (64,), generator=g, dtype=torch.uint8).tolist())
    return (0, raw, 4096, 512, b"/torch_123_456", 3, raw[::-1], True)


def test_ipc_message_survives_json_and_rebuilds_exact_args() -> None:
    shared = _fake_share(1)
    msg = handle_message(shared, tensor_offset=10)
    back = CudaIpcTensor.model_validate(json.loads(json.dumps(msg.model_dump())))
    meta = tensor_metas([("w", torch.zeros(3, 4, 5, dtype=torch.bfloat16))])[0]
    args = rebuild_args(meta, back, device_index=2)
    assert args[6] == 2  # opened on the receiver's own index for the GPU
    assert args[5] is torch.bfloat16 and args[1] == (3, 4, 5) and args[2] == (20, 5, 1)
    assert args[3] == 10 and args[7] == shared[1] and args[8:10] == (4096, 512)
    assert args[11:15] == (shared[4], 3, shared[6], True)


def test_ipc_request_checks_handles_against_tensors() -> None:
    metas = tensor_metas(_named())
    handles = [handle_message(_fake_share(i), 0) for i in range(len(metas))]
    for h, m in zip(handles, metas, strict=True):  # storages exactly large enough
        h.storage_size_bytes = m.nbytes
    req = IpcUpdateRequest(version=1, tensors=metas, handles=handles)
    check_request(req)
    with pytest.raises(ValueError, match="IPC handles for"):
        check_request(req.model_copy(update={"handles": handles[:-1]}))
    over = [handles[0].model_copy(update={"tensor_offset": 1}), *handles[1:]]
    with pytest.raises(ValueError, match="overruns its shared storage"):
        check_request(req.model_copy(update={"handles": over}))
    with pytest.raises(ValueError, match="need a CUDA engine"):
        open_tensors(req, torch.device("cpu"))


def test_ipc_route_refuses_a_cpu_engine_and_reports_its_devices(tiny_model_dir: Path,
                                                                redis_url: str) -> None:
    metas = tensor_metas([("model.norm.weight", torch.ones(64))])
    handle = handle_message(_fake_share(0), 0)
    body = IpcUpdateRequest(version=1, tensors=metas, handles=[handle]).model_dump()
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with running_server(tiny_model_dir, redis_url) as served:
        info = httpx.get(f"{served.url}/admin/weights/transport", headers=auth)
        assert info.status_code == 200 and info.json() == {"devices": ["cpu"]}
        resp = httpx.post(f"{served.url}/admin/weights/update_ipc", json=body, headers=auth)
        assert resp.status_code == 400 and "CUDA engine" in resp.json()["error"]["message"]
        assert httpx.get(f"{served.url}/health").json()["policy_version"] == 0
        assert httpx.post(f"{served.url}/admin/weights/update_ipc", json=body).status_code == 401
        _learner_asks_servers_for_their_devices(served.url)


def _learner_asks_servers_for_their_devices(url: str) -> None:
    from gspo_rl.learner.weights.broadcast import BroadcastSync
    from gspo_rl.redisq.registry import ServerInfo
    from tests.conftest import free_port

    sync = BroadcastSync(client=None, admin_key=ADMIN_KEY)  # type: ignore[arg-type]
    try:
        live = ServerInfo(server_id="test-server", url=url, engine="hf", model="tiny")
        assert sync._server_devices(live) == ["cpu"] and ("test-server", url) in sync._transports
        gone = ServerInfo(server_id="gone", url=f"http://127.0.0.1:{free_port()}", engine="hf",
                          model="tiny")
        assert sync._server_devices(gone) == []  # broadcast for now, asked again next push
        assert ("gone", gone.url) not in sync._transports
    finally:
        sync.close()


# ------------------------------------------------------------------ CUDA (gpu)

def _ipc_sender(q: Any, done: Any) -> None:
    """A learner on the same GPU: export its tensors, wait until the receiver copied them."""
    from gspo_rl.contract.weights.cuda_ipc import export_tensors

    metas, kept, handles = export_tensors(_named("cuda:0"), torch.device("cuda", 0))
    q.put(IpcUpdateRequest(version=3, tensors=metas, handles=handles).model_dump_json())
    done.wait(120)
    del kept


@pytest.mark.gpu
def test_cuda_ipc_weights_cross_processes_on_one_gpu() -> None:
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_ipc_sender, args=(q, done))
    p.start()
    try:
        req = IpcUpdateRequest.model_validate_json(q.get(timeout=120))
        engine = _RecordingEngine(torch.device("cuda", 0))
        asyncio.run(engine.receive_ipc(req))
        got = {n: t.clone() for n, t in engine.loaded}  # copy before the sender frees
    finally:
        done.set()
        p.join(60)
    assert p.exitcode == 0 and engine.version == 3
    for name, want in _named():
        assert got[name].device.type == "cuda" and torch.equal(got[name].cpu(), want), name


def _nccl_sender(port: int) -> None:
    from gspo_rl.contract.weights.collective import make_process_group, send_tensors

    torch.cuda.set_device(0)
    pg = make_process_group("nccl", "127.0.0.1", port, 0, 2, epoch=1, timeout_s=60)
    named = _named("cuda:0")
    send_tensors(pg, named, 16 * 1024, 60, transport_device("nccl", "cuda:0"))
    torch.cuda.synchronize()  # the broadcast is done before this process exits


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs")
def test_nccl_update_lands_on_the_engines_gpu() -> None:
    """Finding 1 on real NCCL: an engine on cuda:1 receives the learner's broadcast."""
    from gspo_rl.contract.weights.collective import host_store
    from tests.conftest import free_port

    port = free_port()
    store = host_store("127.0.0.1", port, timeout_s=60)
    ctx = mp.get_context("spawn")
    engine = _RecordingEngine(torch.device("cuda", 1))
    p = ctx.Process(target=_nccl_sender, args=(port,))
    p.start()
    try:
        join = JoinRequest(master_addr="127.0.0.1", master_port=port, rank=1, world_size=2,
                           backend="nccl", epoch=1)
        update = UpdateRequest(epoch=1, version=2, tensors=tensor_metas(_named()),
                               bucket_bytes=16 * 1024)

        async def body() -> None:
            await engine.join_weight_group(join)
            await engine.receive_weights(update, timeout_s=60)

        asyncio.run(body())
    finally:
        p.join(60)
        del store
    assert p.exitcode == 0
    for (name, got), (_, want) in zip(engine.loaded, _named(), strict=True):
        assert got.device == torch.device("cuda", 1) and torch.equal(got.cpu(), want), name


@pytest.mark.gpu
def test_hf_engine_greedy_and_seeded_on_cuda(tiny_model_dir: Path) -> None:
    """Finding 2: greedy and seeded requests on a CUDA engine, parity with a plain forward."""
    from gspo_rl.server.engines.hf.engine import HFEngine
    from tests.helpers.reference_logprobs import sequence_logprobs

    async def body() -> None:
        engine = HFEngine(str(tiny_model_dir), device="cuda")
        await engine.start()
        try:
            assert engine.device.index is not None
            greedy = SamplingParams(max_tokens=6, temperature=0.0)
            g = await engine.generate([4, 5], greedy)
            a = await engine.generate([1, 2, 3], SamplingParams(max_tokens=8, seed=11))
            b = await engine.generate([1, 2, 3], SamplingParams(max_tokens=8, seed=11))
            assert a.token_ids == b.token_ids
            assert engine.model is not None
            ref = sequence_logprobs(engine.model, [4, 5] + g.token_ids, 2, 1.0)
            assert max(abs(x - y) for x, y in zip(ref, g.logprobs, strict=True)) < 1e-4
        finally:
            await engine.shutdown()

    asyncio.run(asyncio.wait_for(body(), 300))


def _lora_model(model_dir: str) -> torch.nn.Module:
    """The tiny model with rank-4 adapters, built the same way in every process (CPU RNG)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj",
                                                                         "down_proj"]))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def _lora_ipc_sender(model_dir: str, q: Any, done: Any) -> None:
    """A LoRA learner on the same GPU: export its adapter tensors only."""
    from gspo_rl.contract.weights.cuda_ipc import export_tensors
    from gspo_rl.learner.weights.adapter import lora_payload

    model = _lora_model(model_dir).to("cuda:0")
    payload = lora_payload(model)
    assert payload is not None
    named, spec = payload
    metas, kept, handles = export_tensors(named, torch.device("cuda", 0))
    q.put(IpcUpdateRequest(version=5, tensors=metas, handles=handles,
                           lora=spec).model_dump_json())
    done.wait(120)
    del kept


@pytest.mark.gpu
def test_lora_adapter_over_cuda_ipc_reaches_the_hf_engine_exactly(tiny_model_dir: Path) -> None:
    """The CUDA IPC push of a LoRA learner carries the adapter tensors only; the hf engine on
    the same GPU merges them into its base and samples with the learner's log-probabilities."""
    from gspo_rl.server.engines.hf.engine import HFEngine
    from tests.helpers.reference_logprobs import sequence_logprobs

    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_lora_ipc_sender, args=(str(tiny_model_dir), q, done))
    p.start()

    async def body() -> list[tuple[list[int], list[float]]]:
        engine = HFEngine(str(tiny_model_dir), device="cuda")
        await engine.start()
        try:
            req = IpcUpdateRequest.model_validate_json(q.get(timeout=120))
            assert req.lora is not None and all("lora_" in m.name for m in req.tensors)
            await engine.receive_ipc(req)
            assert engine.policy_version == 5
            out = await engine.generate([1, 2, 3], SamplingParams(max_tokens=8, seed=3))
            return [([1, 2, 3] + out.token_ids, out.logprobs)]
        finally:
            await engine.shutdown()

    try:
        samples = asyncio.run(asyncio.wait_for(body(), 300))
    finally:
        done.set()
        p.join(60)
    assert p.exitcode == 0
    ref = _lora_model(str(tiny_model_dir))
    for ids, lps in samples:
        with torch.no_grad():
            ours = sequence_logprobs(ref, ids, 3, 1.0)
        assert max(abs(x - y) for x, y in zip(ours, lps, strict=True)) < 1e-4
