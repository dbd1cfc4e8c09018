"""``megha dashboard`` on a live federation, in headless Chromium (Debian's
``/usr/bin/chromium`` driven by playwright; no browser is downloaded).

The page must show nothing without its token, nor under a host name rebound to
127.0.0.1 (DNS rebinding, made with Chromium's host resolver rules), count the GMs and
LMs, follow a short bench as it runs, show an LM that was killed as down, and push at
most one snapshot a second.  It writes a screenshot to the test's tmp dir, and to
docs/dashboard.png with ``MEGHA_UPDATE_DOCS=1``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from federation.processes import kill, start_dashboard, stop_federation
from megha_cli.dashboard.server import URL_FILE, dashboard_url
from tests.e2e.conftest import Federation

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


NO_VALUE = "\u2013"
"""What the page shows for a figure it does not have yet (an en dash)."""


def _number(text: str) -> float:
    return 0.0 if text.strip() in ("", NO_VALUE) else float(text)


@pytest.mark.timeout(120)
def test_dashboard_follows_the_federation(
    make_federation: Callable[..., Federation], tmp_path: Path
) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    cfg, home = make_federation(gms=2, lms=2, nodes_per_lm=4)
    port = _free_port()
    start_dashboard(cfg, home, port)
    url = dashboard_url(home, "127.0.0.1", port)
    assert (home / URL_FILE).read_text().strip() == url  # where `megha up` users find it

    with sync_api.sync_playwright() as pw:
        rebind = "--host-resolver-rules=MAP rebound.example 127.0.0.1"
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", rebind])
        stranger = browser.new_page()
        assert stranger.goto(f"http://127.0.0.1:{port}/").status == 401  # no token
        assert "no_token" in stranger.content()
        rebound = stranger.goto(url.replace("127.0.0.1", "rebound.example"))
        assert rebound.status == 403  # even with the token: not this dashboard's host
        assert "bad_host" in stranger.content()
        stranger.close()
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        assert "token=" not in page.url  # it went on to the page, the token in a cookie
        expect = sync_api.expect
        expect(page.locator("#gm-count")).to_have_text("2/2", timeout=10_000)
        expect(page.locator("#lm-count")).to_have_text("2/2")
        expect(page.locator("#broker")).to_have_text("up")
        expect(page.locator("#lm-lm0 .bits")).to_have_count(3)  # 2 partitions + free
        assert _number(page.locator("#alloc-tasks").inner_text()) == 0

        # at most one snapshot a second per view
        before = page.evaluate("window.meghaSnapshots || 0")
        page.wait_for_timeout(3000)
        pushed = page.evaluate("window.meghaSnapshots") - before
        assert 1 <= pushed <= 4

        bench = subprocess.Popen(
            [
                sys.executable, "-m", "megha_cli.main", "bench", "--state-dir", str(home),
                "--jobs-count", "60", "--tasks-per-job", "3", "--mean-duration", "0.3",
                "--job-rate", "6", "--timeout", "40", "--quiet", "--out", str(tmp_path / "bench"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            # the counts move while the bench runs
            page.wait_for_function(
                "Number(document.getElementById('alloc-tasks').textContent) > 0", timeout=20_000
            )
            page.wait_for_function(
                "[...document.querySelectorAll('#rates tr#rate-allocations td.num')]"
                ".some(td => Number(td.textContent) > 0)",
                timeout=10_000,
            )
            out, _ = bench.communicate(timeout=60)
        finally:
            if bench.poll() is None:
                bench.kill()
                bench.wait()
        # 2: the bench saw a duplicate launch, its verdict on the scheduler, not the page
        assert bench.returncode in (0, 2), out.decode()[-2000:]
        summary = json.loads((tmp_path / "bench" / "summary.json").read_text())
        assert summary["tasks_finished"] == 180
        page.wait_for_function(
            "Number(document.getElementById('alloc-tasks').textContent) >= 180", timeout=10_000
        )
        assert page.locator("#p99").inner_text() != NO_VALUE

        # a task the GM does not know (or an endpoint it lacks): "not available"
        page.fill("#task-user", "u0")
        page.fill("#task-id", "no-such-task")
        page.click("#task-form button")
        expect(page.locator("#task-result .unavailable")).to_have_text("not available")

        # an LM killed shows down, and the page goes on updating
        started = time.monotonic()
        kill(home, "lm1", signal.SIGKILL)
        expect(page.locator("#lm-count")).to_have_text("1/2", timeout=10_000)
        expect(page.locator("#lm-lm1 .badge").first).to_have_text("down")
        expect(page.locator("#gm-count")).to_have_text("2/2")
        assert time.monotonic() - started < 10
        page.wait_for_timeout(1200)
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    if os.environ.get("MEGHA_UPDATE_DOCS"):  # the README's screenshot, on request only
        shutil.copyfile(shot, DOCS / "dashboard.png")
    assert shot.stat().st_size > 10_000
    # `megha down` stops the dashboard with the federation
    stop_federation(home, quiet=True)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
