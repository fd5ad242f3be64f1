"""End-to-end check of the training loop on this machine's devices; prints a pasteable summary.

    python scripts/gpu_check.py --device cuda            # what scripts/gpu_check.sh runs
    python scripts/gpu_check.py --device cpu             # the same loop on CPUs (gloo)
    python scripts/gpu_check.py --device cuda --dtype bfloat16   # serve in bf16: print the gap
    python scripts/gpu_check.py --device cuda --engine vllm      # the vLLM engine (if installed)

Starts a redis-server, a rollout server (`gspo serve`, hf or vLLM engine, tiny local model; it
sees only its GPU through CUDA_VISIBLE_DEVICES) and, in this
process, the learner; the demo environment (alphabet) samples and rewards groups in a thread.
The learner trains ``--steps`` steps and pushes its weights after each. The weight path follows
the devices: two or more GPUs -> server on cuda:1, learner on cuda:0, NCCL broadcast; one GPU
-> both on cuda:0, CUDA IPC handles (chosen automatically); CPU -> gloo. Then the server's
log-probabilities of fresh samples are compared with the learner's: within 1e-4 when both run
in float32; at another serving dtype the gap is printed, not judged.

Every wait has a deadline (``--timeout-s`` overall): a missing part or a stuck step fails with
a message and exit code 1, never a hang.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from gspo_rl.contract.net import free_port  # noqa: E402

TOLERANCE = 1e-4
API_KEY, ADMIN_KEY = "gpu-check-api", "gpu-check-admin"


class CheckFailed(RuntimeError):
    """A clear reason to stop: printed as the summary's FAIL line."""


def plan(device: str, gpus: int, path: str = "auto") -> dict[str, str]:
    """Devices and weight transport for ``device`` on a machine with ``gpus`` GPUs; ``path``
    "ipc" puts both on one GPU even when there are more, "nccl" demands two."""
    if device == "cpu":
        return {"server": "cpu", "learner": "cpu", "backend": "gloo", "path": "gloo (CPU)",
                "server_gpu": ""}
    if gpus < 1:
        raise CheckFailed("--device cuda but torch sees no CUDA device")
    if path == "nccl" and gpus < 2:
        raise CheckFailed(f"--path nccl needs two GPUs, torch sees {gpus}")
    if gpus >= 2 and path != "ipc":
        return {"server": "cuda:1", "learner": "cuda:0", "backend": "nccl",
                "path": "NCCL broadcast, 2 GPUs", "server_gpu": "1"}
    return {"server": "cuda:0", "learner": "cuda:0", "backend": "nccl",
            "path": "CUDA IPC, 1 GPU (server and learner share it)", "server_gpu": "0"}


def server_args(devices: dict[str, str], engine: str) -> tuple[list[str], dict[str, str]]:
    """`gspo serve` flags and environment for the server's device. On a GPU the server sees
    only its own (CUDA_VISIBLE_DEVICES), so both engines find it as their first device; vLLM
    beside the learner on one GPU takes 30% of its memory."""
    if devices["server_gpu"] == "":
        return ["--engine", engine, *(["--device", "cpu"] if engine == "hf" else [])], {}
    env = {"CUDA_VISIBLE_DEVICES": devices["server_gpu"]}
    if engine == "hf":
        return ["--engine", "hf", "--device", "cuda:0"], env
    shared = devices["server"] == devices["learner"]
    return ["--engine", "vllm", *(["--gpu-memory-utilization", "0.3"] if shared else [])], env


def _pythonpath() -> str:
    """The repository first, then what the caller had (packages carried beside it)."""
    return os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])


def require_parts() -> str:
    """redis-server and the server's Python packages, or a clear failure."""
    missing = [m for m in ("fastapi", "uvicorn", "redis", "transformers", "httpx")
               if not _importable(m)]
    if missing:
        raise CheckFailed(f"missing Python packages: {', '.join(missing)} (see README, "
                          "'Installing')")
    exe = shutil.which("redis-server")
    if exe is None:
        raise CheckFailed("redis-server not found on PATH")
    return exe


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


class Processes:
    """Child processes, all stopped on exit (terminate, then kill)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir, self.procs = log_dir, {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.log_dir / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, **(env or {})})

    def alive(self, name: str) -> None:
        code = self.procs[name].poll()
        if code is not None:
            tail = (self.log_dir / f"{name}.log").read_text()[-2000:]
            raise CheckFailed(f"{name} exited with {code}:\n{tail}")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def wait_until(what: str, cond: Any, deadline: float, check: Any = None) -> None:
    while True:
        if check is not None:
            check()
        try:
            if cond():
                return
        except Exception:  # noqa: BLE001 (not up yet: keep polling until the deadline)
            pass
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out waiting for {what}")
        time.sleep(0.2)


def start_stack(procs: Processes, run_dir: Path, devices: dict[str, str], dtype: str,
                engine: str, deadline: float) -> tuple[str, str, str]:
    """redis-server, a tiny model, `gspo serve`. Returns (server URL, redis URL, model dir)."""
    import httpx

    from gspo_rl.tiny_model import make_tiny_model

    redis_port, port = free_port(), free_port()
    procs.start("redis", [require_parts(), "--port", str(redis_port), "--save", "",
                          "--appendonly", "no", "--dir", str(run_dir)])
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    model = str(make_tiny_model(run_dir / "model", seed=0))
    flags, env = server_args(devices, engine)
    procs.start("server", [sys.executable, "-m", "gspo_rl.cli", "serve", "--model", model, *flags,
                           "--dtype", dtype, "--port", str(port),
                           "--redis-url", redis_url, "--server-id", "gpu-check",
                           "--log-level", "warning"],
                env={"GSPO_API_KEY": API_KEY, "GSPO_ADMIN_KEY": ADMIN_KEY,
                     "PYTHONPATH": _pythonpath(), **env})
    url = f"http://127.0.0.1:{port}"
    wait_until("the server's /health", lambda: httpx.get(f"{url}/health").status_code == 200,
               deadline, lambda: procs.alive("server"))
    return url, redis_url, model


def feed_groups(url: str, stop: threading.Event, errors: list[str]) -> None:
    """The demo environment, in small batches until ``stop``."""
    from gspo_rl.client.examples.alphabet import AlphabetEnvironment
    from gspo_rl.client.runner import run_groups

    env = AlphabetEnvironment(group_size=8, max_tokens=6)
    seed = 0
    while not stop.is_set():
        try:
            run_groups(env, url, 4, api_key=API_KEY, concurrency=2, seed=seed)
        except Exception as exc:  # noqa: BLE001 (reported in the summary, not lost)
            errors.append(repr(exc))
            return
        seed += 1


def train(model: str, redis_url: str, devices: dict[str, str], steps: int, run_dir: Path,
          timeout_s: float) -> Any:
    """The learner in this process (its policy is what the server must match)."""
    from gspo_rl.learner.config import LearnerConfig
    from gspo_rl.learner.loop import Learner

    cfg = LearnerConfig(model=model, redis_url=redis_url, groups_per_step=2, max_steps=steps,
                        lr=1e-3, read_timeout_s=1.0, console=False, device=devices["learner"],
                        save_dir=str(run_dir / "ck"), save_every=steps,
                        weight_sync="broadcast", admin_key=ADMIN_KEY,
                        sync_backend=devices["backend"], sync_timeout_s=60,
                        param_dtype="float32")  # CUDA's default is bf16 (learner/model/speed.py)
    learner = Learner(cfg)
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["state"] = learner.run()
        except BaseException as exc:  # noqa: BLE001 (reported below)
            done["error"] = exc

    thread = threading.Thread(target=run, name="learner", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise CheckFailed(f"the learner did not finish {steps} steps within {timeout_s:.0f}s")
    if "error" in done:
        raise CheckFailed(f"the learner failed: {done['error']!r}")
    return learner


def chosen_paths(learner: Any, devices: dict[str, str]) -> dict[str, str]:
    """Server id -> the transport the learner's weight sync chose for it."""
    from gspo_rl.contract.weights.collective import choose_transport, device_ids

    mine = device_ids(devices["learner"])
    known = getattr(learner.sync, "_transports", {})  # filled only when the learner is on CUDA
    return {sid: choose_transport(devices["backend"], mine, devs)  # type: ignore[arg-type]
            for (sid, _url), devs in known.items()}


def logprob_gap(url: str, learner: Any) -> float:
    """Largest |server - learner| log-probability over fresh samples at T = 0.7."""
    import torch

    from gspo_rl.client.client import GSPOClient

    gap = 0.0
    with GSPOClient(url, api_key=API_KEY) as env:
        # unrecorded: the learner has stopped, and the groups it left unread hold admission
        out = env.rollouts(prompt="Say a word from a to m:", n=4, max_tokens=12,
                           temperature=0.7, seed=5, record=False)
    for r in out.rollouts:
        ids = torch.tensor([out.prompt_token_ids + r.token_ids])
        mask = torch.zeros_like(ids, dtype=torch.float32)
        mask[0, len(out.prompt_token_ids):] = 1
        with torch.no_grad():
            lp = learner.policy.token_logprobs(ids, torch.ones_like(ids), torch.tensor([0.7]),
                                               mask)
        ours = lp[0, len(out.prompt_token_ids):].cpu()
        gap = max(gap, float((ours - torch.tensor(r.logprobs)).abs().max()))
    return gap


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    import httpx
    import torch

    t0 = time.monotonic()
    deadline = t0 + args.timeout_s
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    devices = plan(args.device, gpus, args.path)
    summary: dict[str, Any] = {
        "device": args.device, "gpus": gpus,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "torch": torch.__version__, "cuda": torch.version.cuda, "weight_path": devices["path"],
        "engine": args.engine, "server_dtype": args.dtype, "learner_dtype": "float32",
        "steps": args.steps}
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="gspo-gpu-check-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    procs = Processes(run_dir)
    stop, errors = threading.Event(), []
    try:
        url, redis_url, model = start_stack(procs, run_dir, devices, args.dtype, args.engine,
                                            deadline)
        feeder = threading.Thread(target=feed_groups, args=(url, stop, errors), daemon=True)
        feeder.start()
        learner = train(model, redis_url, devices, args.steps, run_dir,
                        max(1.0, deadline - time.monotonic()))
        stop.set()
        version = httpx.get(f"{url}/health").json()["policy_version"]
        summary["server_policy_version"] = version
        summary["transport_chosen"] = chosen_paths(learner, devices).get("gpu-check",
                                                                        devices["backend"])
        want = "ipc" if devices["server"] == devices["learner"] != "cpu" else devices["backend"]
        if summary["transport_chosen"] != want:
            raise CheckFailed(f"the learner chose {summary['transport_chosen']}, not {want}")
        if version != args.steps:
            raise CheckFailed(f"server serves version {version}, the learner pushed "
                              f"{args.steps} (server log: {run_dir / 'server.log'})")
        gap = logprob_gap(url, learner)
        summary["logprob_gap"] = gap
        if args.dtype == "float32" and gap > TOLERANCE:
            raise CheckFailed(f"server vs learner log-probabilities differ by {gap:.2e} "
                              f"(> {TOLERANCE:g}) at equal dtypes")
        if errors:
            raise CheckFailed(f"the environment failed: {errors[0]}")
        summary["result"] = "PASS"
    except CheckFailed as exc:
        summary["result"], summary["reason"] = "FAIL", str(exc)
    finally:
        stop.set()
        procs.stop()
        summary["seconds"] = round(time.monotonic() - t0, 1)
        summary["logs"] = str(run_dir)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the server's dtype (the learner trains in float32)")
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--path", choices=["auto", "ipc", "nccl"], default="auto",
                    help="auto: NCCL with 2+ GPUs, CUDA IPC with one; ipc: one GPU anyway")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--json", type=Path, help="also write the summary here")
    ap.add_argument("--run-dir", type=Path, help="model, logs (default: a fresh temp dir)")
    args = ap.parse_args(argv)
    try:
        summary = run_check(args)
    except CheckFailed as exc:  # before anything started (a missing part, no GPU)
        summary = {"device": args.device, "result": "FAIL", "reason": str(exc)}
    print("---- gspo gpu_check summary ----")
    for key, value in summary.items():
        shown = f"{value:.3e}" if key == "logprob_gap" else value
        print(f"{key}: {shown}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0 if summary["result"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
