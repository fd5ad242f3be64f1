"""The live dashboard (``GET /dashboard``, ``/v1/dashboard/*``) in a real headless Chromium
(``tests.helpers.browser``), against a real server (uvicorn, the hf engine on the tiny model)
and a real Redis: groups recorded over HTTP, a learner state (trained rewards included), its
heartbeat and a stall published as the learner publishes them, a peer registered as servers
register (signed, with its load and a failed weight update). The page shows the learner, the
queue, the servers (version, engine, load, weight sync), rewards (sampled, trained), waste and
rates, a group's turns with its tokens shaded; it follows Redis as it changes; it shows a
multi-turn episode turn by turn with each turn's reward and advantage; it asks for the key when
it has none, and a server without keys serves it without one; the JSON needs the key. The page
fits a laptop's width and a narrow window without a horizontal scroll bar.

``GSPO_DASHBOARD_SCREENSHOT=path`` also saves a screenshot (docs/figures/dashboard.png);
without Debian's chromium and its driver (``scripts/setup.sh`` with ``GSPO_BROWSER=1``, which
``scripts/test.sh`` sets) the module is skipped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from gspo_rl.contract.schema import (
    REWARD_TRAINED,
    REWARD_TRAINED_RECENT,
    REWARD_TRAINED_STEPS,
    Keys,
)
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.runtime.progress import ProgressMonitor
from gspo_rl.learner.runtime.published import Heartbeat, publish_state, state_fields
from gspo_rl.learner.tracking.metrics import MetricsLogger
from gspo_rl.redisq.ready.reader import GroupReader
from gspo_rl.redisq.registry import Load, ServerInfo, WeightSync, register
from tests.conftest import RedisServer, wait_until
from tests.helpers.serving import ADMIN_KEY, API_KEY, MODEL_NAME, Served, running_server

pytest.importorskip("selenium.webdriver")
from tests.helpers.browser import (  # noqa: E402
    MISSING,
    chromium,
    click,
    load,
    number,
    save_page,
    text,
    wait_for,
)

if MISSING:
    pytest.skip(MISSING, allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

AUTH = {"Authorization": f"Bearer {API_KEY}"}
KEYS = Keys()
LIVE_S = 15  # how long the page may take to show a change in Redis (it polls every 2 s)


def post(served: Served, path: str, body: Any) -> dict[str, Any]:
    r = httpx.post(served.url + path, json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def play(served: Served, task_id: str, rewards: list[float] | None) -> str:
    """One group of ``len(rewards)`` samples, rewarded (None: two samples, left open)."""
    out = post(served, "/v1/rollouts", {
        "prompt": f"Say {task_id}:", "max_tokens": 6, "ignore_eos": True, "temperature": 1.0,
        "n": len(rewards or [0, 0]), "metadata": {"task_id": task_id}})
    if rewards is not None:
        post(served, "/v1/rewards", [{"rollout_id": x["rollout_id"], "reward": v}
                                     for x, v in zip(out["rollouts"], rewards, strict=True)])
    return out["group_id"]


def publish_learner(client: redis.Redis, cfg: LearnerConfig, step: int, tokens: int,
                    trained: tuple[float, float]) -> None:
    """The learner's state at ``step`` (``step - 1`` groups and ``tokens`` tokens trained) as
    it publishes it, with the mean reward of its last step's groups and of its recent steps'
    (``TrainedRewards``)."""
    publish_state(client, KEYS, {
        **state_fields(cfg, step, step, step - 1, tokens_trained=tokens),
        REWARD_TRAINED: repr(trained[0]), REWARD_TRAINED_RECENT: repr(trained[1]),
        REWARD_TRAINED_STEPS: step})


def register_peer(client: redis.Redis, sync: WeightSync) -> None:
    """Another server, as its heartbeat registers it (signed with the admin key)."""
    register(client, KEYS, ServerInfo(
        server_id="peer", url="http://127.0.0.1:9", engine="vllm", model=MODEL_NAME,
        policy_version=sync.version - 1 if sync.state == "failed" else sync.version,
        load=Load(running=3, waiting=1), weight_sync=sync), ADMIN_KEY, ttl_s=600)


@pytest.fixture(scope="module")
def run(tiny_model_dir: Path, redis_mod: RedisServer) -> Iterator[dict[str, Any]]:
    """A server with groups recorded, a learner that published its state and a stall, and a
    peer server whose last weight update failed."""
    with running_server(tiny_model_dir, redis_mod.url) as served:
        client = redis.Redis.from_url(redis_mod.url)
        cfg = LearnerConfig(model=str(tiny_model_dir), redis_url=redis_mod.url,
                            max_staleness=2, groups_per_step=2)
        publish_learner(client, cfg, 3, 24, (0.25, 0.4))
        beat = Heartbeat(client, KEYS).start()
        progress = ProgressMonitor(MetricsLogger(console=False),
                                   publish=lambda f: publish_state(client, KEYS, f))
        progress.stalled("no_groups", "the ready stream is empty: dashboard test")
        register_peer(client, WeightSync(version=3, state="failed", started_at=time.time() - 5,
                                         duration_s=1.5, error="RuntimeError: boom"))
        groups = {"signal": [play(served, "alpha", [0.0, 1.0]), play(served, "beta", [1.0, 0.0])],
                  "equal": play(served, "gamma", [1.0, 1.0]), "open": play(served, "open", None)}
        post(served, "/v1/evals", {"name": "held-out", "policy_version": 3,
                                   "metrics": {"mean_reward": 0.625, "pass@1": 0.5}})
        try:
            yield {"served": served, "groups": groups, "client": client, "cfg": cfg}
        finally:
            beat.stop()
            client.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def get(served: Served, path: str, **headers: str) -> httpx.Response:
    return httpx.get(served.url + path, headers=headers, timeout=30)


def test_the_json_needs_the_key_and_the_page_does_not(run: dict[str, Any]) -> None:
    served = run["served"]
    gid = run["groups"]["equal"]
    for path in ("/v1/dashboard/state", "/v1/dashboard/groups", f"/v1/dashboard/groups/{gid}"):
        assert get(served, path).status_code == 401, path
        assert get(served, path, Authorization="Bearer wrong").status_code == 401, path
    page = get(served, "/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert API_KEY not in page.text
    for name in ("dashboard.js", "panels.js", "rollouts.js", "dashboard.css"):
        assert get(served, f"/dashboard/{name}").status_code == 200, name
    assert get(served, "/dashboard/nope.js").status_code == 404


def test_the_json_says_what_redis_holds(run: dict[str, Any]) -> None:
    served, groups = run["served"], run["groups"]
    state = get(served, "/v1/dashboard/state", **AUTH).json()
    learner, fates, queue = state["learner"], state["fates"], state["queue"]
    assert learner["connected"] and learner["step"] == 3 and learner["version"] == 3
    assert learner["last_stall"]["reason"] == "no_groups"
    assert "dashboard test" in learner["last_stall"]["detail"]
    assert (fates["generated"], fates["published"], fates["trained"]) == (4, 2, 2)
    assert fates["tokens_generated"] == 4 * 2 * 6 and fates["tokens_trained"] == 24
    assert fates["dropped"] == {"dropped_zero_variance": 1}
    assert queue["open"] == 1 and queue["published_unread"] == 2
    assert state["rewards"]["sampled_groups"] == 3
    assert state["rewards"]["sampled_mean"] == pytest.approx(4 / 6)
    assert state["rewards"]["published_recent_mean"] == pytest.approx(0.5)
    rewards = state["rewards"]
    assert rewards["trained_last_mean"] == 0.25 and rewards["trained_recent_mean"] == 0.4
    assert rewards["trained_recent_steps"] == 3
    peer, this = state["servers"]
    assert (peer["server_id"], this["server_id"]) == ("peer", "test-server") and this["this"]
    assert this["verified"] and this["heartbeat_age_s"] < 10 and this["weight_sync"] is None
    assert this["engine"] == "hf" and set(this["load"]) == {"running", "waiting"}
    assert peer["verified"] and peer["load"] == {"running": 3, "waiting": 1}
    assert peer["weight_sync"]["state"] == "failed" and peer["weight_sync"]["version"] == 3
    (result,) = state["evals"]
    assert result["name"] == "held-out" and result["metrics"]["pass@1"] == 0.5
    listed = get(served, "/v1/dashboard/groups", **AUTH).json()["groups"]
    where = {g["group_id"]: g["where"] for g in listed}
    assert where == {groups["signal"][0]: "unread", groups["signal"][1]: "unread",
                     groups["equal"]: "no_signal"}
    detail = get(served, f"/v1/dashboard/groups/{groups['signal'][0]}?max_tokens=3",
                 **AUTH).json()
    assert detail["advantages_from"] == "ready_stream"
    low, high = detail["rollouts"]
    assert low["advantage"] < 0 < high["advantage"]
    context, turn = low["segments"]
    assert context["kind"] == "context" and "Say alpha:" in context["text"]
    assert turn["kind"] == "model" and len(turn["tokens"]) == 3 == len(turn["logprobs"])
    assert turn["truncated"] == 6 - 3 and turn["versions"] == [0, 0, 0]
    assert get(served, "/v1/dashboard/groups/nope", **AUTH).status_code == 404


def test_the_page_shows_the_run_and_shades_the_tokens(run: dict[str, Any], browser: Any) -> None:
    served = run["served"]
    load(browser, f"{served.url}/dashboard#key={API_KEY}")
    wait_for(browser, "#learner-activity", lambda t: "waiting for groups" in t
             or "between steps" in t)
    assert browser.execute_script("return location.hash") == ""  # the key left the URL
    assert "connected" in text(browser, "#card-learner")
    assert text(browser, '#card-learner dd[data-field="step"]') == "3"
    assert "last stall: no_groups" in text(browser, "#card-learner")
    assert text(browser, '#card-queue dd[data-field="open (waiting for rewards)"]') == "1"
    assert text(browser, '#card-queue dd[data-field="published, unread"]') == "2"
    assert text(browser, '#card-fates dd[data-field="dropped zero variance"]') == "1"
    assert "held-out" in text(browser, "#card-evals") and "pass@1 0.500" in text(
        browser, "#card-evals")
    wait_for(browser, "#group-list .group-row")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#group-list .group-row")) == 3
    gid = run["groups"]["signal"][0]
    click(browser, f'.group-row[data-group="{gid}"]')
    wait_for(browser, f'#group-detail .rollout[data-rollout="{gid}:0"] .tok')
    assert "Say alpha:" in text(browser, "#group-detail .context")
    token = browser.find_element(By.CSS_SELECTOR, "#group-detail .tok")
    colors = {}
    for mode in ("logprob", "advantage", "version"):
        Select(browser.find_element(By.ID, "shade")).select_by_value(mode)
        assert browser.find_element(By.ID, "group-detail").get_attribute("data-shade") == mode
        colors[mode] = token.value_of_css_property("background-color")
    assert len(set(colors.values())) == 3, colors
    assert colors["advantage"].startswith("rgba(220, 38, 38")  # the low reward's episode
    shot = os.environ.get("GSPO_DASHBOARD_SCREENSHOT")
    if shot:
        save_page(browser, Path(shot))


def test_the_page_shows_the_servers_rewards_and_waste(run: dict[str, Any],
                                                      browser: Any) -> None:
    load(browser, f"{run['served'].url}/dashboard#key={API_KEY}")
    wait_for(browser, '#card-learner dd[data-field="step"]', lambda t: t == "3")
    assert text(browser, '#card-fates dd[data-field="tokens trained"]') == "24 (50%)"
    assert text(browser, '#card-fates dd[data-field="waste, tokens not trained"]') == "50%"
    assert text(browser, '#card-rewards dd[data-field="sampled, all groups"]') == "0.667"
    assert text(browser, '#card-rewards dd[data-field="trained, last step"]') == "0.250"
    assert text(browser, '#card-rewards dd[data-field="trained, recent steps"]') == (
        "0.400 over 3 steps")
    assert text(browser, '#card-rewards dd[data-field="published, last 2"]') == "0.500"
    peer = '#card-servers tr[data-server="peer"]'
    assert [text(browser, f'{peer} td[data-col="{c}"]') for c in (
        "engine", "version", "load")] == ["vllm", "2", "3 running, 1 waiting"]
    assert text(browser, f'{peer} td[data-col="weight sync"]').startswith("v3 failed")
    assert "RuntimeError: boom" in text(browser, f'{peer} td[data-col="weight sync"]')
    this = '#card-servers tr[data-server="test-server"]'
    assert text(browser, f'{this} td[data-col="server"]') == "test-server (this)"
    assert [text(browser, f'{this} td[data-col="{c}"]') for c in (
        "engine", "version", "weight sync")] == ["hf", "0", "none yet"]
    wait_for(browser, f'{this} td[data-col="load"]', lambda t: t == "0 running, 0 waiting")


@pytest.mark.parametrize("width", [1280, 640])
def test_the_page_fits_the_window(run: dict[str, Any], browser: Any, width: int) -> None:
    browser.set_window_size(width, 900)
    load(browser, f"{run['served'].url}/dashboard#key={API_KEY}")  # the page alone, keyed
    wait_for(browser, "#group-detail .tok")
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0


def test_without_a_key_the_page_asks_for_it(run: dict[str, Any], browser: Any) -> None:
    load(browser, f"{run['served'].url}/dashboard")
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    form = wait_for(browser, "#key-form", lambda t: "needs its API key" in t)
    assert form.is_displayed() and text(browser, "#conn") == "API key needed"
    browser.find_element(By.ID, "key-input").send_keys(API_KEY)
    browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
    wait_for(browser, "#conn", lambda t: t == "live")
    assert not form.is_displayed()
    wait_until(lambda: text(browser, '#card-learner dd[data-field="step"]') == "3",
               "the learner's step shown")


def test_a_trained_group_stays_browsable_with_its_advantages(run: dict[str, Any]) -> None:
    """The learner reads the published groups (delivered), then acknowledges them, which trims
    their entries from the stream: the dashboard still lists them, with their advantages."""
    served, signal = run["served"], run["groups"]["signal"]
    client = redis.Redis.from_url(served.app.state.settings.redis_url)
    reader = GroupReader(client, KEYS, consumer="dashboard-test")

    def where() -> dict[str, str]:
        listed = get(served, "/v1/dashboard/groups", **AUTH).json()["groups"]
        return {g["group_id"]: g["where"] for g in listed if g["group_id"] in signal}

    batch = reader.read_batch(2, 0, 5.0)
    assert len(batch.groups) == 2
    wait_until(lambda: set(where().values()) == {"delivered"}, "both delivered")
    reader.ack(batch.entry_ids)
    assert client.xlen(KEYS.ready_stream) == 0
    wait_until(lambda: set(where().values()) == {"acknowledged"}, "both acknowledged")
    detail = get(served, f"/v1/dashboard/groups/{signal[1]}", **AUTH).json()
    assert detail["advantages_from"] == "ready_stream"
    assert [r["advantage"] > 0 for r in detail["rollouts"]] == [True, False]  # rewards 1, 0
    client.close()


def test_the_page_follows_redis_live(run: dict[str, Any], browser: Any) -> None:
    """The learner trains a step and the peer loads its weights: the open page shows both
    within ``LIVE_S``, and its rates (they need 10 s of watching, which the tests above did)."""
    served, client = run["served"], run["client"]
    load(browser, f"{served.url}/dashboard#key={API_KEY}")
    wait_for(browser, '#card-learner dd[data-field="step"]', lambda t: t == "3")
    publish_learner(client, run["cfg"], 4, 36, (0.75, 0.5))
    register_peer(client, WeightSync(version=4, state="loaded", started_at=time.time() - 2,
                                     duration_s=0.25))
    live = WebDriverWait(browser, LIVE_S)
    live.until(lambda d: text(d, '#card-learner dd[data-field="step"]') == "4", "step 4")
    assert text(browser, '#card-rewards dd[data-field="trained, last step"]') == "0.750"
    assert text(browser, '#card-rewards dd[data-field="trained, recent steps"]') == (
        "0.500 over 4 steps")
    assert text(browser, '#card-fates dd[data-field="waste, tokens not trained"]') == "25%"
    sync = '#card-servers tr[data-server="peer"] td[data-col="weight sync"]'
    live.until(lambda d: text(d, sync).startswith("v4 loaded"), "the peer's update")
    assert "in 0.25 s" in text(browser, sync)
    rate = '#card-fates dd[data-field="tokens/s trained"]'
    live.until(lambda d: (number(d, rate) or 0.0) > 0, "a rate of trained tokens")
    assert number(browser, '#card-fates dd[data-field="tokens/s generated"]') is not None


def test_a_multi_turn_episode_shows_each_turn(run: dict[str, Any], browser: Any) -> None:
    """Two episodes of two chat turns each, rewarded per turn (equal totals, the bonus on a
    different turn): each turn is shown with its context, its reward and its advantage."""
    served = run["served"]
    opened = post(served, "/v1/groups", {"size": 2})
    gid, rids = opened["group_id"], opened["rollout_ids"]
    chat = openai.OpenAI(base_url=served.v1, api_key=API_KEY, max_retries=0, timeout=60)
    for rid in rids:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "first question"}]
        for follow_up in ("second question", None):
            c = chat.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=3,
                                             extra_body={"rollout_id": rid}).choices[0]
            if follow_up:
                msgs += [{"role": "assistant", "content": c.message.content},
                         {"role": "user", "content": follow_up}]
    post(served, "/v1/rewards", [
        {"rollout_id": rids[0], "reward": 1.0, "turn_rewards": [1.0, 0.0]},
        {"rollout_id": rids[1], "reward": 1.0, "turn_rewards": [0.0, 1.0]}])
    load(browser, f"{served.url}/dashboard#key={API_KEY}")
    click(browser, f'.group-row[data-group="{gid}"]')
    turns = f'#group-detail .rollout[data-rollout="{rids[1]}"] .turn'
    wait_for(browser, f'{turns}[data-turn="1"] .tok')
    for rid, rewards, advantages in ((rids[0], [1.0, 0.0], [0.0, -1.0]),
                                     (rids[1], [0.0, 1.0], [0.0, 1.0])):
        shown = browser.find_elements(
            By.CSS_SELECTOR, f'#group-detail .rollout[data-rollout="{rid}"] .turn')
        assert [t.get_attribute("data-turn") for t in shown] == ["0", "1"]
        assert [float(t.get_attribute("data-reward")) for t in shown] == rewards
        assert [float(t.get_attribute("data-advantage")) for t in shown] == pytest.approx(
            advantages, abs=1e-3)
        for t in shown:
            label = t.find_element(By.CSS_SELECTOR, ".label").text
            assert "reward" in label and "advantage" in label, label
        contexts = browser.find_elements(
            By.CSS_SELECTOR, f'#group-detail .rollout[data-rollout="{rid}"] .context')
        assert "first question" in contexts[0].text and "second question" in contexts[1].text


def test_a_server_without_keys_serves_the_dashboard_without_one(
        tiny_model_dir: Path, redis_mod: RedisServer, browser: Any) -> None:
    with running_server(tiny_model_dir, redis_mod.url, api_key=None, admin_key=None,
                        key_prefix="keyless", server_id="keyless-server") as served:
        assert get(served, "/v1/dashboard/state").status_code == 200
        load(browser, f"{served.url}/dashboard")
        browser.execute_script("sessionStorage.clear()")
        browser.refresh()
        wait_for(browser, "#conn", lambda t: t == "live")
        assert not browser.find_element(By.ID, "key-form").is_displayed()
        assert "not connected" in text(browser, "#card-learner")
        wait_for(browser, '#card-servers tr[data-server="keyless-server"] td[data-col="server"]',
                 lambda t: t == "keyless-server (this)")
