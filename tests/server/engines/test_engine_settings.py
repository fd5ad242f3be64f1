"""`gspo serve`'s engine settings reach the engines: dtype (bf16 on GPUs by default),
max_model_len, and vLLM's tensor parallelism, memory share, eager mode and any other argument.
The engines are built, not started (nothing is loaded)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gspo_rl.cli import app
from gspo_rl.cli.engine_args import parse_engine_args
from gspo_rl.server.api.app import build_engine
from gspo_rl.server.config import ServerSettings


@pytest.mark.parametrize(("kw", "cuda", "want"), [
    ({"engine": "vllm"}, True, "bfloat16"),
    ({"engine": "vllm"}, False, "float32"),
    ({"engine": "hf"}, True, "bfloat16"),
    ({"engine": "hf", "device": "cpu"}, True, "float32"),
    ({"engine": "hf", "device": "cuda:1"}, False, "bfloat16"),
    ({"engine": "hf"}, False, "float32"),
    ({"engine": "vllm", "dtype": "float32"}, True, "float32"),
])
def test_dtype_auto_is_bf16_on_gpus_and_f32_on_cpus(kw: dict, cuda: bool, want: str) -> None:
    assert ServerSettings(model="m", **kw).resolved_dtype(cuda) == want


def test_vllm_only_settings_are_refused_for_the_hf_engine() -> None:
    for kw in ({"tensor_parallel_size": 2}, {"gpu_memory_utilization": 0.5},
               {"vllm_args": {"swap_space": 4}}):
        with pytest.raises(ValueError, match="use --engine vllm"):
            ServerSettings(model="m", **kw)
    with pytest.raises(ValueError):
        ServerSettings(model="m", engine="vllm", gpu_memory_utilization=1.5)


def test_hf_engine_gets_dtype_and_max_model_len(tiny_model_dir: Path) -> None:
    s = ServerSettings(model=str(tiny_model_dir), device="cpu", dtype="bfloat16",
                       max_model_len=32)
    engine = build_engine(s)
    assert engine.dtype == torch.bfloat16 and engine.max_model_len == 32  # type: ignore
    assert engine.device == torch.device("cpu")


@pytest.mark.vllm
def test_vllm_engine_gets_every_setting(tiny_model_dir: Path) -> None:
    s = ServerSettings(model=str(tiny_model_dir), engine="vllm", dtype="bfloat16",
                       max_model_len=48, tensor_parallel_size=2, gpu_memory_utilization=0.3,
                       enforce_eager=True, vllm_args={"swap_space": 2, "block_size": 32})
    engine = build_engine(s)
    kw = engine._engine_kw  # type: ignore[attr-defined]
    assert (kw["dtype"], kw["tensor_parallel_size"], kw["gpu_memory_utilization"],
            kw["enforce_eager"], kw["swap_space"], kw["block_size"]) == (
        "bfloat16", 2, 0.3, True, 2, 32)
    assert engine.max_model_len == 48 and engine.weight_ranks() == 2
    from gspo_rl.server.engines.vllm.engine import VLLMEngine

    with pytest.raises(ValueError, match="logprobs_mode"):
        VLLMEngine(str(tiny_model_dir), engine_args={"logprobs_mode": "raw_logprobs"})
    # native LoRA: vLLM's own LoRA layers, one slot, the rank rounded up to one vLLM accepts
    kw = VLLMEngine(str(tiny_model_dir), max_lora_rank=12)._engine_kw  # type: ignore[attr-defined]
    assert (kw["enable_lora"], kw["max_lora_rank"], kw["max_loras"]) == (True, 16, 1)
    assert "enable_lora" not in VLLMEngine(str(tiny_model_dir))._engine_kw  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="set by the gspo vLLM engine"):
        VLLMEngine(str(tiny_model_dir), engine_args={"enable_lora": True})


def test_lora_rank_slots_and_the_max_lora_rank_setting() -> None:
    from gspo_rl.server.config import ServerSettings
    from gspo_rl.server.engines.vllm.native_lora import rank_slot

    assert [rank_slot(r) for r in (1, 2, 8, 9, 64, 300, 512)] == [1, 8, 8, 16, 64, 320, 512]
    with pytest.raises(ValueError, match="above vLLM's largest"):
        rank_slot(513)
    assert ServerSettings(model="m", engine="vllm", max_lora_rank=16).max_lora_rank == 16
    for unset in (0, "0", ""):  # compose's GSPO_MAX_LORA_RANK=0
        assert ServerSettings(model="m", engine="vllm", max_lora_rank=unset).max_lora_rank is None
    with pytest.raises(ValueError, match="vLLM settings"):
        ServerSettings(model="m", engine="hf", max_lora_rank=8)


def test_parse_engine_args() -> None:
    assert parse_engine_args(["swap_space=8", "kv-cache-dtype=fp8", "enable_lora=true",
                              'hf_overrides={"rope_theta": 1e6}']) == {
        "swap_space": 8, "kv_cache_dtype": "fp8", "enable_lora": True,
        "hf_overrides": {"rope_theta": 1e6}}
    for bad in (["novalue"], ["=3"], ["a b=1"], ["x=1", "x=2"]):
        with pytest.raises(ValueError):
            parse_engine_args(bad)


def test_gspo_serve_refuses_bad_engine_flags() -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["serve", "--model", "m", "--vllm-arg", "oops"])
    assert out.exit_code == 2 and "invalid --vllm-arg" in out.output
    out = runner.invoke(app, ["serve", "--model", "m", "--dtype", "float8"])
    assert out.exit_code == 2 and "dtype" in out.output
    out = runner.invoke(app, ["serve", "--model", "m", "--tensor-parallel-size", "2"])
    assert out.exit_code == 2 and "use --engine vllm" in out.output


def test_gspo_up_device_reaches_the_server() -> None:
    from gspo_rl.launch.up import UpConfig, _server_device_args

    f32 = ["--dtype", "float32"]  # behavior log-probs: exact only at the learner's dtype
    assert _server_device_args(UpConfig(run_dir=Path("r"))) == ["--engine", "hf", *f32]
    assert _server_device_args(UpConfig(run_dir=Path("r"), device="cuda")) == [
        "--engine", "hf", *f32, "--device", "cuda"]
    # vLLM beside the learner on one GPU: its memory share leaves room for the learner
    assert _server_device_args(UpConfig(run_dir=Path("r"), device="cuda", engine="vllm")) == [
        "--engine", "vllm", *f32, "--gpu-memory-utilization", "0.3"]



def test_gspo_up_lora_has_vllm_serve_the_adapters_natively() -> None:
    from gspo_rl.launch.up import UpConfig, _server_lora_args

    assert _server_lora_args(UpConfig(run_dir=Path("r"), lora_rank=8, engine="vllm")) == [
        "--max-lora-rank", "8"]
    assert _server_lora_args(UpConfig(run_dir=Path("r"), lora_rank=8)) == []  # hf merges
    assert _server_lora_args(UpConfig(run_dir=Path("r"), engine="vllm")) == []
