"""A participant frozen (SIGSTOP) during the weight transfer costs little past its freeze, and
says so while it lasts (issue 35).

Learner frozen: a real learner process (``BroadcastSync`` in a child) pushes to a real server
(hf engine, uvicorn in this process); when the server starts receiving version 2 the test
stops the learner, and the server's receive fails meanwhile (after 1 s, with the message
the issue's server logged, ``Operation timed out!``), answering 504 with its side of the group
still open, as in the issue (where it closes, the learner's broadcast fails on the closed
connection, fast either way). Before, the learner, continued, broadcast on into a group the
server had left and waited out its whole timeout (30 s here) before it read that reply; now
it reads the reply as it arrives, abandons the broadcast, rebuilds the group and loads
version 2 within seconds of its continuation.

Server stuck (the same case seen from the other side, in process: no second server process):
the server's receive starts 3 s late; the push waits on it, reporting a stall every second
(the pace is shortened for the test), and loads the version as soon as the server takes part.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
import torch
from transformers import AutoModelForCausalLM

import gspo_rl.learner.weights.replies as replies_module
from gspo_rl.contract.schema import Keys
from gspo_rl.learner.weights.broadcast import BroadcastSync
from tests.helpers.serving import ADMIN_KEY, API_KEY, running_server
from tests.learner.weights.test_broadcast import _perturb, _wait_registered

REPO = Path(__file__).resolve().parents[3]
FREEZE_S = 3.0
TIMEOUT_S = 30.0  # the push's bound: what a wait that is not cut short costs

LEARNER = """
import json, logging, sys, time
import redis, torch
from transformers import AutoModelForCausalLM
from gspo_rl.contract.schema import Keys
from gspo_rl.learner.weights.broadcast import BroadcastSync
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
model_dir, redis_url, key, timeout_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
sync = BroadcastSync(redis.Redis.from_url(redis_url), Keys(), admin_key=key, timeout_s=timeout_s)
for version in (1, 2):
    with torch.no_grad():
        next(model.parameters()).add_(0.01)
    r = sync.push(model, version)
    print(json.dumps({"version": version, "ok": r.ok, "at": time.time()}), flush=True)
sync.close()
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSPO_")}
    return {**env, "GSPO_API_KEY": API_KEY, "GSPO_ADMIN_KEY": ADMIN_KEY,
            "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_a_learner_frozen_mid_transfer_costs_seconds_past_its_freeze(tiny_model_dir, redis_url,
                                                                      tmp_path):
    client = redis.Redis.from_url(redis_url)
    err = tmp_path / "learner.err"
    with contextlib.ExitStack() as stack:
        served = stack.enter_context(running_server(tiny_model_dir, redis_url))
        _wait_registered(client, 1)
        engine = served.app.state.engine
        receive = engine.receive_weights
        proc: list[subprocess.Popen] = []
        continued: list[float] = []
        during: list[str] = []
        held: list[object] = []

        def unfreeze() -> None:
            during.append(served.app.state.weight_updates.describe())
            continued.append(time.time())
            os.kill(proc[0].pid, signal.SIGCONT)

        async def freezing_receive(req, timeout_s):
            if req.version == 2 and not continued:  # the learner stops before its buckets
                os.kill(proc[0].pid, signal.SIGSTOP)
                threading.Timer(FREEZE_S, unfreeze).start()
                held.append(engine._weight_pg)  # its side stays open: see the docstring
                await asyncio.sleep(1.0)
                raise RuntimeError("Operation timed out!")  # while the learner is frozen
            return await receive(req, timeout_s)

        engine.receive_weights = freezing_receive
        err_file = stack.enter_context(open(err, "wb"))
        proc.append(subprocess.Popen(
            [sys.executable, "-c", LEARNER, str(tiny_model_dir), redis_url, ADMIN_KEY,
             str(TIMEOUT_S)], cwd=REPO, env=_env(), stdout=subprocess.PIPE,
            stderr=err_file, text=True))
        try:
            out, _ = proc[0].communicate(timeout=120)
        finally:
            if proc[0].poll() is None:
                os.kill(proc[0].pid, signal.SIGCONT)
                proc[0].kill()
        version = httpx.get(f"{served.url}/health").json()["policy_version"]
    reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    log = err.read_text()
    assert [r["ok"] for r in reports] == [True, True], (reports, log)
    assert version == 2
    # While frozen, the server said why it was behind (its refusals append this clause).
    assert during and "weight update to version 2 failed" in during[0], during
    # The learner read the 504 as it continued and abandoned the broadcast at once.
    assert "broadcast of version 2 failed: server test-server" in log, log
    assert "failed to load weights: HTTP 504" in log, log
    assert "did not finish within" not in log, log
    # Loaded within seconds of its continuation, not after its 30 s timeout.
    assert continued and reports[1]["at"] - continued[0] < TIMEOUT_S / 3, (reports, log)


def test_a_stuck_server_is_a_stall_while_it_lasts(tiny_model_dir, redis_url, monkeypatch):
    monkeypatch.setattr(replies_module, "STALL_AFTER_S", 1.0)
    monkeypatch.setattr(replies_module, "EVERY_S", 1.0)
    client = redis.Redis.from_url(redis_url)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with running_server(tiny_model_dir, redis_url) as served:
        _wait_registered(client, 1)
        engine = served.app.state.engine
        receive = engine.receive_weights
        stuck_at: list[float] = []

        async def stuck_receive(req, timeout_s):
            if req.version == 2:  # stuck before its part of the broadcast
                stuck_at.append(time.monotonic())
                await asyncio.sleep(FREEZE_S)
            return await receive(req, timeout_s)

        engine.receive_weights = stuck_receive
        sync = BroadcastSync(client, Keys(), admin_key=ADMIN_KEY, timeout_s=TIMEOUT_S)
        stalls: list[tuple[float, str]] = []
        sync.on_stall = lambda detail: stalls.append((time.monotonic(), detail))
        try:
            assert sync.push(model, 1).ok
            _perturb(model, seed=4)
            report = sync.push(model, 2)
            done = time.monotonic()
        finally:
            sync.close()
        assert report.ok and report.servers == ["test-server"], report
        assert httpx.get(f"{served.url}/health").json()["policy_version"] == 2
    # Said while it lasted: a stall each second past the first, naming the silent server.
    during = [d for t, d in stalls if t < stuck_at[0] + FREEZE_S]
    assert during and all("no reply yet from test-server" in d for d in during), stalls
    assert "weight push of version 2: broadcasting the buckets" in during[0]
    assert done - stuck_at[0] < FREEZE_S + TIMEOUT_S / 3, done - stuck_at[0]


def test_a_server_that_fails_to_join_is_dropped_at_once(tiny_model_dir, redis_url):
    """Two servers; one answers its join with a 504 at once (it cannot reach the learner's
    store, say). The group can never form: the push stops waiting for it at that reply, drops
    that server and loads the other, instead of waiting out the group's timeout three times
    (a server that answers /health was never dropped)."""
    client = redis.Redis.from_url(redis_url)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with running_server(tiny_model_dir, redis_url) as good, \
            running_server(tiny_model_dir, redis_url, server_id="cut-off") as cut_off:
        _wait_registered(client, 2)

        async def refuse(req):
            raise RuntimeError("cannot reach the learner's store")

        cut_off.app.state.engine.join_weight_group = refuse
        # Short: the other server's join of the abandoned group waits it out (and the
        # server's shutdown waits for that request).
        sync = BroadcastSync(client, Keys(), admin_key=ADMIN_KEY, timeout_s=6)
        try:
            report = sync.push(model, 1)
        finally:
            sync.close()
        assert report.ok and report.servers == ["test-server"] and report.dropped == [
            "cut-off"], report
        assert report.seconds < 6, report  # less than one wait for the group
        assert httpx.get(f"{good.url}/health").json()["policy_version"] == 1
