"""How the dashboard tests read a page that redraws itself (``tests.helpers.browser``), in a
real headless Chromium. The dashboard replaces its cards and group list on every poll (2 s);
a page that replaces its element every 250 ms is read and clicked many times without a stale
element (a CI run failed on one; read the old way, 2% of reads and 18% of clicks here found
a replaced element). And ``load`` gives each test a new page: a plain ``get`` of the URL the
browser shows (the dashboard's, ``#key=`` included) keeps the old page and its state.
Skipped without Debian's chromium.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("selenium.webdriver")
from tests.helpers.browser import (  # noqa: E402
    MISSING,
    chromium,
    click,
    load,
    number,
    text,
    wait_for,
)

if MISSING:
    pytest.skip(MISSING, allow_module_level=True)

REDRAWN = """data:text/html,<div id="box"></div><p id="clicks">0</p><script>
let n = 0;
function draw() {
  const b = document.createElement("button");
  b.className = "row"; b.textContent = "12.5";
  b.addEventListener("click", () => { document.getElementById("clicks").textContent = ++n; });
  document.getElementById("box").replaceChildren(b);
}
draw(); setInterval(draw, 250);
</script>"""
READS, CLICKS = 60, 15


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        driver.get(REDRAWN)
        yield driver


def test_reads_survive_the_redraws(browser: Any) -> None:
    for _ in range(READS):
        assert text(browser, "#box .row") == "12.5"
        assert number(browser, "#box .row") == 12.5
        assert wait_for(browser, "#box .row", lambda t: t == "12.5") is not None


def test_clicks_survive_the_redraws(browser: Any) -> None:
    before = int(text(browser, "#clicks"))
    for _ in range(CLICKS):
        click(browser, "#box .row")
    assert int(text(browser, "#clicks")) == before + CLICKS


def test_load_opens_a_new_page_where_get_keeps_the_old_one(browser: Any) -> None:
    url = "data:text/html,<p>page</p>#key=k"
    browser.get(url)
    browser.execute_script("window.earlier = true")
    browser.get(url)  # the same URL: only a move to its fragment
    assert browser.execute_script("return window.earlier === true")
    load(browser, url)
    assert browser.execute_script("return window.earlier === undefined")
