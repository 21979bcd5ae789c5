"""The monitor's page in a real browser (headless Chromium, driven by Playwright): the token,
the run list, the loss plot gaining points while a real run trains, and Stop from the page
with --monitor-control. Skipped without Playwright (the test extra) or a Chromium (apt's
`chromium`; TRAINDECK_CHROMIUM names another). TRAINDECK_MONITOR_SHOTS=DIR also writes the
screenshots docs/window.md shows."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.runs import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("TRAINDECK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Headless, and quiet: without the background-networking flags Chromium calls home, which a
# closed network answers with timeouts.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
playwright = pytest.importorskip("playwright.sync_api", reason="Playwright: pip install -e .[test]")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason="no Chromium (apt install chromium)"),
]


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    """core.train --monitor-control on a tiny model for 100,000 steps: (process, run, URL)."""
    where = tmp_path_factory.mktemp("watched")
    args = ["--preset", "cpu-tiny", "--hidden-dim", "32", "--max-steps", "100000"]
    args += ["--eval-every", "20", "--sample-tokens", "60", "--out", "tiny-notes"]
    args += ["--monitor-control", "--monitor-port", "0"]
    out = open(where / "stdout.txt", "w")  # noqa: SIM115 (the process writes it)
    proc = subprocess.Popen(
        [sys.executable, "-m", "core.train", *args],
        cwd=where,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=out,
        stderr=subprocess.DEVNULL,
    )
    url, deadline = None, time.monotonic() + 120
    while url is None and time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"Monitor: (http://\S+)", (where / "stdout.txt").read_text())
        url = found.group(1) if found else time.sleep(0.1)
    assert url, (where / "stdout.txt").read_text()
    yield proc, where / "tiny-notes", url
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    out.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with playwright.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),  # a fresh profile
            executable_path=CHROMIUM,
            args=FLAGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
        )
        yield context
        context.close()


def legend_step(page) -> int:
    """The newest step the loss plot holds (its legend shows the latest values)."""
    text = page.locator('.plot[data-plot="loss"] .u-legend .u-value').first.inner_text()
    return int(text.replace(",", "")) if text.strip().isdigit() else 0


def test_the_page_needs_its_token_then_shows_the_run_live_and_stops_it(training, browser):
    proc, run, url = training
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "console",
        lambda m: (
            m.type == "error"
            and not m.location.get("url", "").endswith("/favicon.ico")  # the refused page's
            and errors.append(f"{m.text} ({m.location.get('url')})")
        ),
    )

    response = page.goto(url.split("?")[0])
    assert response.status == 403 and "needs its token" in page.content()

    errors.clear()  # the refused page's own 403s are what was asked for
    page.goto(url)
    item = page.locator('.run-item[data-name="tiny-notes"]')
    item.wait_for(timeout=60_000)
    page.wait_for_function(
        "() => document.querySelector('.run-item .state')?.textContent === 'running'",
        timeout=60_000,
    )
    assert "?token=" not in page.url  # the token left the address bar; the cookie holds it
    page.locator('.plot[data-plot="loss"]').wait_for(timeout=60_000)
    page.wait_for_function(
        "() => /step \\d/.test(document.querySelector('#run-progress').textContent)"
    )
    first = legend_step(page)
    page.wait_for_function(
        f"() => +document.querySelector('.plot[data-plot=\"loss\"] .u-legend .u-value')"
        f".textContent.replace(/,/g, '') > {first}",
        timeout=30_000,
    )  # points arrive while it trains, with no reload
    assert legend_step(page) > first

    shots = os.environ.get("TRAINDECK_MONITOR_SHOTS")
    if shots:  # a picture with a few evaluations and a sample in it
        page.wait_for_function(
            "() => /step (1[2-9]\\d|[2-9]\\d\\d)/.test(document.querySelector('#samples-step')"
            ".textContent)",
            timeout=600_000,
        )
        page.wait_for_timeout(1500)
        page.screenshot(path=str(Path(shots) / "monitor_desktop.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})  # a phone
    page.wait_for_timeout(800)
    assert page.evaluate("() => document.scrollingElement.scrollWidth") <= 390
    if shots:
        page.screenshot(path=str(Path(shots) / "monitor_phone.png"))
    page.set_viewport_size({"width": 1280, "height": 900})

    page.on("dialog", lambda dialog: dialog.accept())
    page.locator('#controls button[data-action="stop"]').click()
    page.wait_for_function(
        "() => document.querySelector('#control-msg').textContent.startsWith('Stop requested')"
    )
    page.wait_for_function(
        "() => document.querySelector('.run-item .state')?.textContent === 'stopped'",
        timeout=60_000,
    )  # the page hears of the end before the command closes the monitor
    assert errors == []
    assert proc.wait(timeout=60) == 130  # stopped on request, as Ctrl+C does
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped" and 0 < status["step"] < 100_000
    assert ckpt.load(run / "checkpoints" / "latest.pt")["step"] == status["step"]
