"""The Slurm deployment (deploy/slurm/), run for real on a Slurm cluster started on this machine.

Four slurmd nodes on one host (``tests/deploy/slurm_cluster.py``). The CPU variant
(``deploy/slurm/cpu.env``: a two-rank learner over two nodes with torchrun and gloo, Redis on
the first, two hf-engine servers on the third, one ``gspo env alphabet`` per server, the tiny
model made by the job) is submitted with ``deploy/slurm/submit.sh``, and the test checks what
the issue asks, through Slurm's commands, HTTP and the run's files only:

1. it trains (steps in ``metrics.jsonl``); a plain ``scancel`` ends it with a checkpoint at its
   last step, and leaves no process listening;
2. resubmitted, it resumes from that checkpoint (step numbers and versions go on, Redis came
   back from its append-only file), and no group is ever trained twice;
3. a server added mid-run as its own job on the fourth node gets the current weights by the
   end of the first push that started after it registered, and when that job is killed the
   broadcast goes on without it;
4. the time limit (shortened with ``scontrol update``) makes Slurm send the batch script the
   SIGTERM that ``--signal=B:TERM@<s>`` asks for: it stops everything in order, with a
   checkpoint, and the job completes with exit code 0 before the limit.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.deploy.slurm_cluster import (
    FREEZER,
    SlurmCluster,
    cgroup_v1_writable,
    free_port,
    free_port_pair,
    missing_programs,
    port_open,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]
SUBMIT = REPO / "deploy" / "slurm" / "submit.sh"
CONFIG = REPO / "deploy" / "slurm" / "cpu.env"
STEP_TIMEOUT_S = 420  # the first steps include every process's start on a busy 2-core machine


def _records(metrics: Path) -> list[dict[str, Any]]:
    if not metrics.is_file():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return out


def _steps(metrics: Path) -> list[dict[str, Any]]:
    return [r for r in _records(metrics) if r.get("event", "step") == "step" and "step" in r]


def _latest_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    states = sorted((run_dir / "checkpoints").glob("step-*/learner_state.json"))
    return json.loads(states[-1].read_text()) if states else None


def _seconds(hms: str) -> int:
    """Slurm's [D-]HH:MM:SS (or MM:SS) as seconds."""
    days, _, rest = hms.rpartition("-")
    secs = 0
    for part in rest.split(":"):
        secs = secs * 60 + int(part)
    return secs + 86400 * int(days or 0)


def _hms(secs: int) -> str:
    return f"{secs // 3600}:{secs % 3600 // 60:02d}:{secs % 60:02d}"


def _health(port: int) -> dict[str, Any] | None:
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


class Run:
    """The run directory and the jobs of one test, with waits that print what they wait for
    and fail early (with the logs) when a job ended."""

    def __init__(self, cluster: SlurmCluster, run_dir: Path, env: dict[str, str]) -> None:
        self.cluster, self.run_dir, self.env = cluster, run_dir, env
        self.metrics = run_dir / "checkpoints" / "metrics.jsonl"

    def submit(self, *args: str, env: dict[str, str] | None = None) -> str:
        r = self.cluster.run("bash", str(SUBMIT), *args, str(CONFIG),
                             env={**self.env, **(env or {})})
        job = r.stdout.strip().split(";")[0]
        print(f"[slurm] submitted job {job} {' '.join(args)}", flush=True)
        return job

    def logs(self) -> str:
        files = sorted(self.run_dir.glob("slurm-*.out")) + sorted(
            self.run_dir.glob("jobs/*/logs/*.log"))
        return "\n".join(f"--- {p}\n{SlurmCluster.tail(p, 2500)}" for p in files)

    def wait_steps(self, job: str, until: int, what: str) -> list[dict[str, Any]]:
        """Wait until the learner has logged step ``until``; job ``job`` must keep running."""
        t0, last_print = time.monotonic(), 0.0
        while True:
            steps = _steps(self.metrics)
            if steps and steps[-1]["step"] >= until:
                return steps
            if job not in self.cluster.jobs():
                pytest.fail(f"job {job} ended while waiting for {what}:\n{self.logs()}")
            now = time.monotonic()
            if now - t0 > STEP_TIMEOUT_S:
                pytest.fail(f"no step {until} ({what}) within {STEP_TIMEOUT_S}s:\n{self.logs()}")
            if now - last_print > 15:
                last_print = now
                state = self._pending_state(job)
                print(f"[slurm] {now - t0:4.0f}s waiting for step {until} ({what}); at "
                      f"{steps[-1]['step'] if steps else 'none'}; job {job} {state}", flush=True)
            time.sleep(1)

    def _pending_state(self, job: str) -> str:
        """The job's state and reason; a failed batch launch (Slurm requeues the job held)
        fails the test at once, with the daemons' logs (they say why)."""
        state = self.cluster.job_field(job, "JobState") or "?"
        reason = self.cluster.job_field(job, "Reason") or "?"
        if "launch_failed" in reason.lower().replace(" ", "_"):
            pytest.fail(f"job {job}'s batch launch failed ({reason}):\n"
                        f"{self.cluster.logs_tail()}")
        return f"{state} ({reason})"


def _secrets(run: Run) -> dict[str, str]:
    """The run's secrets file (made by its first job, mode 600)."""
    path = run.run_dir / "secrets.env"
    assert path.stat().st_mode & 0o777 == 0o600, oct(path.stat().st_mode)
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _redis(run: Run, port: int) -> redis.Redis:
    """A client of the run's Redis, with the password from the run's secrets file."""
    return redis.Redis(host="127.0.0.1", port=port, password=_secrets(run)["GSPO_REDIS_PASSWORD"],
                       socket_timeout=10, decode_responses=True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_slurm_cpu_job_trains_resumes_and_takes_servers_that_come_and_go(tmp_path):
    missing = missing_programs()
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing): "
                    "GSPO_SLURM=1 bash scripts/setup.sh installs slurm-wlm and munge")
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root to launch job steps (this user is not root)")
    if not cgroup_v1_writable():
        pytest.skip(f"{FREEZER} is not a writable cgroup v1 hierarchy: proctrack/cgroup, "
                    "which the job's stop relies on (docs/deployment/slurm.md), cannot run")
    # A short root: slurmstepd's Unix sockets live in the spool directory and a path over 108
    # bytes (pytest-xdist's tmp_path made 117) fails every batch launch.
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    cluster = SlurmCluster(root, nodes=4)
    print(f"[slurm] cluster {cluster.name}: nodes {cluster.nodes}", flush=True)
    run_dir = tmp_path / "run"
    ports = {"GSPO_REDIS_PORT": free_port(), "GSPO_RDZV_PORT": free_port(),
             "GSPO_SERVER_PORT": free_port_pair()}
    # A learning rate 20x below the demo's: the alphabet task stays unlearned for the test's
    # ~100 steps, so groups keep unequal rewards and steps keep coming (a learned task's groups
    # all score 1.0 and are dropped for lack of signal: no steps, by design).
    env = {"GSPO_RUN_DIR": str(run_dir), "GSPO_VENV": sys.prefix,
           "GSPO_LEARNER_ARGS": "--device cpu --lr 1e-4",
           # one group in flight per environment: lean on a shared 2-core machine
           "GSPO_ENV_ARGS": "--group-size 8 --concurrency 1",
           "GSPO_STOP_GRACE_S": "120",
           **{k: str(v) for k, v in ports.items()}}
    run = Run(cluster, run_dir, env)
    try:
        cluster.start()
        _scenario(cluster, run, ports)
    except BaseException:
        print(f"[slurm] logs:\n{run.logs()}\n{cluster.logs_tail()}", flush=True)
        raise
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _scenario(cluster: SlurmCluster, run: Run, ports: dict[str, int]) -> None:
    server_ports = [ports["GSPO_SERVER_PORT"], ports["GSPO_SERVER_PORT"] + 1]

    # ------------------------------------------------------------ 1. train, scancel
    job1 = run.submit()
    run.wait_steps(job1, 3, "the first run's training")
    cluster.run("scancel", job1)  # every step and the batch script get SIGTERM at once
    state = cluster.wait_job_end(job1, cluster.kill_wait_s + 90)
    print(f"[slurm] job {job1} ended: {state}", flush=True)
    run1 = _steps(run.metrics)
    ckpt1 = _latest_checkpoint(run.run_dir)
    assert ckpt1 is not None, "no checkpoint after scancel"
    assert ckpt1["step"] == run1[-1]["step"], (
        f"the checkpoint is at step {ckpt1['step']}, the learner logged step "
        f"{run1[-1]['step']}: it did not checkpoint on SIGTERM")
    stops = [r for r in _records(run.metrics) if r.get("event") == "stop"]
    assert len(stops) == 1 and stops[0]["step"] == run1[-1]["step"], stops
    # The servers outlived the learner: even a step trained after the signal pushed to both.
    assert run1[-1]["sync_ok"], run1[-1]
    for port in [ports["GSPO_REDIS_PORT"], *server_ports]:
        assert not port_open(port), f"port {port} still open after job {job1} ended"
    assert any((run.run_dir / "redis").rglob("*.aof")), "Redis wrote no append-only file"

    # ------------------------------------------------------------ 2. resubmit: resume
    job2 = run.submit()
    run.wait_steps(job2, ckpt1["step"] + 2, "the resumed run's training")
    starts = [r for r in _records(run.metrics) if r.get("event") == "start"]
    assert len(starts) == 2 and starts[1]["resumed_from"] == ckpt1["step"], starts
    assert starts[1]["checkpoint"].endswith(f"step-{ckpt1['step']:08d}"), starts[1]
    resumed = [s for s in _steps(run.metrics) if s["run_id"] == starts[1]["run_id"]]
    assert resumed[0]["step"] == ckpt1["step"] + 1, resumed[0]
    assert resumed[0]["version"] > run1[-1]["version"]
    assert resumed[0]["groups_trained_total"] > ckpt1["groups_trained"]
    # Redis came back from its append-only file: a group trained by the first job is still
    # there (trained groups are kept keep_trained_s, 600 s), served by the second job's server.
    api_key = _secrets(run)["GSPO_API_KEY"]
    first = run1[0]["group_ids"][0]
    wait_for(lambda: _health(server_ports[0]) is not None, "the second job's first server", 300)
    r = httpx.get(f"http://127.0.0.1:{server_ports[0]}/v1/groups/{first}", timeout=10,
                  headers={"Authorization": f"Bearer {api_key}"})
    assert r.status_code == 200 and r.json()["state"] == "published", (r.status_code, r.text)

    # ------------------------------------------------------------ 3. a server joins
    registry = _redis(run, ports["GSPO_REDIS_PORT"])
    with pytest.raises(redis.AuthenticationError):  # Redis asks for the password
        redis.Redis(host="127.0.0.1", port=ports["GSPO_REDIS_PORT"], socket_timeout=10).ping()
    extra_port, extra_id = free_port(), "gspo-extra-s0"
    job3 = run.submit("--add-servers", env={
        "GSPO_SERVERS": "1", "GSPO_SERVER_NODES": "1", "GSPO_SERVER_PORT": str(extra_port),
        "GSPO_SERVER_ID_PREFIX": "gspo-extra-s"})
    wait_for(lambda: registry.hexists("gspo:servers", extra_id) or job3 not in cluster.jobs(),
             f"the added server {extra_id} (job {job3}) to register in Redis", 300)
    assert job3 in cluster.jobs(), f"job {job3} ended:\n{run.logs()}"
    # Registered now. A push may be under way (started before), but the push after the next
    # step record starts after this point: it must reach the new server. With sync_every = 1
    # that is within one sync interval (or the learner's healing reached it sooner).
    v_reg = _steps(run.metrics)[-1]["version"]
    nxt = run.wait_steps(job2, _steps(run.metrics)[-1]["step"] + 2, "two pushes after the join")
    got = _health(extra_port)
    assert got is not None and got["policy_version"] >= v_reg + 2, (got, v_reg)
    print(f"[slurm] added server: registered at learner version {v_reg}, holds "
          f"{got['policy_version']} once the learner logged version {nxt[-1]['version']}",
          flush=True)
    # It keeps following, and the broadcast never stalled: every later step synced everyone.
    after_join = run.wait_steps(job2, nxt[-1]["step"] + 2, "more steps with the new server")
    got = _health(extra_port)
    assert got is not None and got["policy_version"] >= after_join[-1]["version"]
    assert all(s["sync_ok"] for s in after_join if s["version"] > v_reg + 1), after_join[-4:]

    # ------------------------------------------------------------ and leaves, abruptly
    # Its server dies as on a lost node: SIGKILL to its step (no deregistration, no goodbye).
    cluster.run("scancel", "--signal=KILL", cluster.step_id(job3, "gspo-server"))
    state3 = cluster.wait_job_end(job3, 120)
    assert not port_open(extra_port)
    at_leave = _steps(run.metrics)[-1]["step"]
    after_leave = run.wait_steps(job2, at_leave + 3, "steps after the added server died")
    assert after_leave[-1]["sync_ok"], after_leave[-1]
    for port in server_ports:  # the job's own servers still follow the pushes
        wait_for(lambda p=port: (_health(p) or {}).get("policy_version", -1)
                 >= after_leave[-1]["version"],
                 f"the server on port {port} to hold version {after_leave[-1]['version']}", 60)
    # Its heartbeat expired and the learner dropped its registration.
    wait_for(lambda: not registry.hexists("gspo:servers", extra_id),
             "the dead server's registration to be pruned", 120)
    registry.close()
    print(f"[slurm] added server job {job3}: {state3}; steps went on to "
          f"{after_leave[-1]['step']}", flush=True)

    # ------------------------------------------------------------ 4. the time limit
    # submit.sh asked for --signal=B:TERM@GSPO_STOP_GRACE_S (120 s here): shorten the time
    # limit to 100 s from now, and slurmctld signals the batch script at its next check.
    ran = _seconds(cluster.job_field(job2, "RunTime") or "0:0")
    cluster.run("scontrol", "update", f"JobId={job2}", f"TimeLimit={_hms(ran + 100)}")
    print(f"[slurm] job {job2}: time limit set to {_hms(ran + 100)} (ran {ran}s)", flush=True)
    state2 = cluster.wait_job_end(job2, 100 + cluster.kill_wait_s + 60)
    out2 = (run.run_dir / f"slurm-{job2}.out").read_text()
    assert "stop requested" in out2, out2[-2000:]
    assert state2 == "COMPLETED" and cluster.job_field(job2, "ExitCode") == "0:0", (
        state2, cluster.job_field(job2, "ExitCode"), out2[-2000:])
    steps = _steps(run.metrics)
    ckpt2 = _latest_checkpoint(run.run_dir)
    assert ckpt2 is not None and ckpt2["step"] == steps[-1]["step"], (ckpt2, steps[-1])
    for port in [ports["GSPO_REDIS_PORT"], *server_ports]:
        assert not port_open(port), f"port {port} still open after job {job2} ended"

    # ------------------------------------------------------------ exactly once, both runs
    numbers = [s["step"] for s in steps]
    assert numbers == list(range(1, len(steps) + 1)), numbers
    versions = [s["version"] for s in steps]
    assert versions == sorted(set(versions)), versions
    trained = [g for s in steps for g in s["group_ids"]]
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert ckpt2["groups_trained"] == len(trained)
    print(f"[slurm] {len(steps)} steps, {len(trained)} groups, each trained once; "
          f"runs ended {state} and {state2}", flush=True)
