"""A real headless Chromium for the dashboard's tests, and how they read the page.

Debian's ``chromium`` and ``chromium-driver`` (``scripts/setup.sh`` with ``GSPO_BROWSER=1``);
``MISSING`` says why they cannot run (None when they can), for a module-level skip. Import
this module only after ``pytest.importorskip("selenium.webdriver")``. ``chromium()`` starts
one browser in a throw-away profile and always quits it; ``load`` opens a page afresh (a
``get`` of the URL already shown, ``#key=`` included, only moves to its fragment: the old
page and its state stay); ``text``, ``number`` and
``wait_for`` read what the page shows (``wait_for`` for at most ``WAIT_S``), ``click``
clicks; ``save_page`` saves the whole page as a PNG. The page redraws its cards and group
list on every poll, so an element found may be replaced before it is read: these helpers
find it again (``STALE_TRIES`` times) rather than read a detached one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
MISSING = None if (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)) else (
    "Debian's chromium and chromium-driver are not installed (scripts/setup.sh with "
    "GSPO_BROWSER=1)")
WAIT_S = 20
STALE_TRIES = 10


@contextlib.contextmanager
def chromium(width: int = 1366, height: int = 900) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="gspo-chromium-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER),
                              options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _fresh(read: Callable[[], Any]) -> Any:
    """``read()``, run again while what it found is replaced by the page's next redraw."""
    for attempt in range(STALE_TRIES):
        try:
            return read()
        except StaleElementReferenceException:
            if attempt == STALE_TRIES - 1:
                raise
    raise AssertionError("unreachable")


def load(driver: Any, url: str) -> None:
    """``url`` loaded as a new page, whatever the browser showed before."""
    driver.get("about:blank")
    driver.get(url)


def text(driver: Any, css: str) -> str:
    return str(_fresh(lambda: driver.find_element(By.CSS_SELECTOR, css).text))


def click(driver: Any, css: str) -> None:
    """Click the first element matching ``css`` once it is there (found again if redrawn)."""
    wait_for(driver, css)
    _fresh(lambda: driver.find_element(By.CSS_SELECTOR, css).click())


def number(driver: Any, css: str) -> float | None:
    """The number the first element matching ``css`` shows (None: none, or not a number)."""
    def read() -> str | None:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        return found[0].text if found else None
    shown = _fresh(read)
    try:
        return float(shown.replace(",", "")) if shown is not None else None
    except ValueError:
        return None


def wait_for(driver: Any, css: str, pred: Callable[[str], bool] = bool) -> Any:
    """The first element matching ``css`` once ``pred(its text)`` holds."""
    def ready(d: Any) -> Any:
        found = d.find_elements(By.CSS_SELECTOR, css)
        return found[0] if found and pred(found[0].text) else False
    try:
        return WebDriverWait(driver, WAIT_S, ignored_exceptions=(
            StaleElementReferenceException,)).until(ready, f"{css} within {WAIT_S} s")
    except TimeoutException as e:  # what the page showed instead, for the report
        shown = driver.execute_script("return document.body ? document.body.innerText : ''")
        raise AssertionError(f"{e.msg}; the page showed:\n{str(shown)[:1500]}") from None


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
