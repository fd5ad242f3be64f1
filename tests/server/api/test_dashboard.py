"""The live dashboard (``GET /dashboard``, ``/v1/dashboard/*``) in a real headless Chromium,
against a real server (uvicorn, the hf engine on the tiny model) and a real Redis: a few groups
recorded with rewards over HTTP, a learner state and its heartbeat published as the learner
publishes them, a stall published through ``ProgressMonitor``. The page shows the learner, the
queue, a recent group's turns with its tokens shaded, and switches the shading; it asks for the
key when it has none; the JSON endpoints answer 401 without it. The page fits a laptop's width
and a narrow window without a horizontal scroll bar.

``GSPO_DASHBOARD_SCREENSHOT=path`` also saves a screenshot (docs/figures/dashboard.png).
Chromium and its driver are Debian's (``scripts/setup.sh`` with ``GSPO_BROWSER=1``, which
``scripts/test.sh`` sets); without them the module is skipped.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gspo_rl.contract.schema import Keys
from gspo_rl.learner.config import LearnerConfig
from gspo_rl.learner.runtime.progress import ProgressMonitor
from gspo_rl.learner.runtime.published import Heartbeat, publish_state, state_fields
from gspo_rl.learner.tracking.metrics import MetricsLogger
from gspo_rl.redisq.ready.reader import GroupReader
from tests.conftest import RedisServer, wait_until
from tests.helpers.serving import API_KEY, Served, running_server

webdriver = pytest.importorskip("selenium.webdriver")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/setup.sh "
                "with GSPO_BROWSER=1)", allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

AUTH = {"Authorization": f"Bearer {API_KEY}"}
KEYS = Keys()
WAIT_S = 20


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


@pytest.fixture(scope="module")
def run(tiny_model_dir: Path, redis_mod: RedisServer) -> Iterator[dict[str, Any]]:
    """A server with groups recorded and a learner that published its state and a stall."""
    with running_server(tiny_model_dir, redis_mod.url) as served:
        client = redis.Redis.from_url(redis_mod.url)
        cfg = LearnerConfig(model=str(tiny_model_dir), redis_url=redis_mod.url,
                            max_staleness=2, groups_per_step=2)
        publish_state(client, KEYS, state_fields(cfg, 3, 3, 2, tokens_trained=24))
        beat = Heartbeat(client, KEYS).start()
        progress = ProgressMonitor(MetricsLogger(console=False),
                                   publish=lambda f: publish_state(client, KEYS, f))
        progress.stalled("no_groups", "the ready stream is empty: dashboard test")
        groups = {"signal": [play(served, "alpha", [0.0, 1.0]), play(served, "beta", [1.0, 0.0])],
                  "equal": play(served, "gamma", [1.0, 1.0]), "open": play(served, "open", None)}
        post(served, "/v1/evals", {"name": "held-out", "policy_version": 3,
                                   "metrics": {"mean_reward": 0.625, "pass@1": 0.5}})
        try:
            yield {"served": served, "groups": groups}
        finally:
            beat.stop()
            client.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="gspo-chromium-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1366,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER),
                              options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def get(served: Served, path: str, **headers: str) -> httpx.Response:
    return httpx.get(served.url + path, headers=headers, timeout=30)


def text(driver: Any, css: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, css).text


def wait_for(driver: Any, css: str, pred: Any = bool) -> Any:
    """The first element matching ``css`` once ``pred(its text)`` holds."""
    def ready(d: Any) -> Any:
        found = d.find_elements(By.CSS_SELECTOR, css)
        return found[0] if found and pred(found[0].text) else False
    return WebDriverWait(driver, WAIT_S).until(ready, f"{css} within {WAIT_S} s")


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
    assert [s["server_id"] for s in state["servers"]] == ["test-server"]
    assert state["servers"][0]["verified"] and state["servers"][0]["heartbeat_age_s"] < 10
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
    browser.get(f"{served.url}/dashboard#key={API_KEY}")
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
    browser.find_element(By.CSS_SELECTOR, f'.group-row[data-group="{gid}"]').click()
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


def save_page(browser: Any, path: Path) -> None:
    """The whole page at a laptop's width, tokens shaded by advantage, as a PNG."""
    Select(browser.find_element(By.ID, "shade")).select_by_value("advantage")
    browser.execute_script("window.scrollTo(0, 0)")
    height = browser.execute_script("return document.documentElement.scrollHeight")
    metrics = {"width": 1366, "height": height, "deviceScaleFactor": 1, "mobile": False}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(path))
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


@pytest.mark.parametrize("width", [1280, 640])
def test_the_page_fits_the_window(run: dict[str, Any], browser: Any, width: int) -> None:
    browser.set_window_size(width, 900)
    browser.get(f"{run['served'].url}/dashboard#key={API_KEY}")  # the page alone, keyed
    wait_for(browser, "#group-detail .tok")
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0


def test_without_a_key_the_page_asks_for_it(run: dict[str, Any], browser: Any) -> None:
    browser.get(f"{run['served'].url}/dashboard")
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
