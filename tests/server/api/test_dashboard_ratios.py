"""The rollout browser's "importance ratio" shading, in a real headless Chromium
(``tests.helpers.browser``) against a real server (the hf engine on the tiny model) and a real
Redis: a group recorded over HTTP, then one of its rollouts' log-ratios written as the learner
writes them after a step (``publish_token_ratios``). The JSON carries them per token (null for
the rollout without any); the page shades those tokens around ratio 1 (blue above, orange
below), its tooltip gives the ratio, the other rollout's tokens stay unshaded and the legend
says why. Skipped without Debian's chromium and its driver, as tests/server/api/test_dashboard.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from gspo_rl.contract.schema import Keys
from gspo_rl.learner.runtime.published import publish_token_ratios
from tests.helpers.serving import API_KEY, running_server

pytest.importorskip("selenium.webdriver")
from tests.helpers.browser import MISSING, chromium, click, load, text, wait_for  # noqa: E402

if MISSING:
    pytest.skip(MISSING, allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

AUTH = {"Authorization": f"Bearer {API_KEY}"}
KEYS = Keys()
LOG_RATIOS = [0.375, -0.375, 0.5, -0.5, 0.0, 0.25]  # exact in float16, one per sampled token
BLUE, ORANGE = "rgba(37, 99, 235", "rgba(234, 88, 12"


def model_turns(served: Any, gid: str) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"{served.url}/v1/dashboard/groups/{gid}", headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return {x["rollout_id"]: next(s for s in x["segments"] if s["kind"] == "model")
            for x in r.json()["rollouts"]}


def test_tokens_are_shaded_by_their_importance_ratio(tiny_model_dir: Path,
                                                     redis_url: str) -> None:
    with running_server(tiny_model_dir, redis_url) as served, chromium() as browser:
        out = httpx.post(f"{served.url}/v1/rollouts", headers=AUTH, timeout=60, json={
            "prompt": "Say ratio:", "max_tokens": len(LOG_RATIOS), "ignore_eos": True,
            "temperature": 1.0, "n": 2}).json()
        gid, (trained, other) = out["group_id"], [x["rollout_id"] for x in out["rollouts"]]
        assert httpx.post(f"{served.url}/v1/rewards", headers=AUTH, timeout=60, json=[
            {"rollout_id": trained, "reward": 0.0},
            {"rollout_id": other, "reward": 1.0}]).status_code == 200
        assert all(s["log_ratios"] is None for s in model_turns(served, gid).values())
        client = redis.Redis.from_url(redis_url)
        publish_token_ratios(client, KEYS, {trained: np.array(LOG_RATIOS)}, 600)
        client.close()
        turns = model_turns(served, gid)
        assert turns[trained]["log_ratios"] == LOG_RATIOS and turns[other]["log_ratios"] is None

        load(browser, f"{served.url}/dashboard#key={API_KEY}")
        click(browser, f'.group-row[data-group="{gid}"]')
        wait_for(browser, f'#group-detail .rollout[data-rollout="{other}"] .tok')
        Select(browser.find_element(By.ID, "shade")).select_by_value("ratio")
        shaded = browser.find_elements(
            By.CSS_SELECTOR, f'#group-detail .rollout[data-rollout="{trained}"] .tok')
        colors = [t.value_of_css_property("background-color") for t in shaded]
        assert [c.startswith(BLUE) for c in colors[:4]] == [True, False, True, False]
        assert [c.startswith(ORANGE) for c in colors[:4]] == [False, True, False, True]
        assert colors[4].endswith(", 0)")  # ratio 1: no tint
        assert f"ratio {math.exp(0.375):.3f}" in shaded[0].get_attribute("title")
        assert f"ratio {math.exp(-0.5):.3f}" in shaded[3].get_attribute("title")
        for t in browser.find_elements(
                By.CSS_SELECTOR, f'#group-detail .rollout[data-rollout="{other}"] .tok'):
            assert t.value_of_css_property("background-color") == "rgba(0, 0, 0, 0)"
            assert "ratio none" in t.get_attribute("title")
        assert f"{len(LOG_RATIOS)} tokens unshaded: no ratio yet" in text(browser, "#legend")
