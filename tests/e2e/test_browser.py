"""The on-call path in a real browser: log in, watch the remote job's output live, mark the task failed.

Debian's chromium (`apt-get install chromium`) driven headless by Playwright for Python; Playwright's
own browser download is never used. The screenshot is always saved under the test's tmp dir; with
NPA_E2E_SCREENSHOT=1 it also replaces docs/img/live-log.png (the README's picture).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.e2e.slurm_runs import DAG_ID, TASK_ID, start_job, ticks, wait_for_ticks

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DOC_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "live-log.png"


@pytest.fixture
def page():
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} missing: apt-get install -y chromium")
    with sync_api.sync_playwright() as p:
        # Playwright starts the browser with a new, empty profile directory of its own.
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 860})
            context.set_default_timeout(30_000)
            yield context.new_page()
        finally:
            browser.close()


def log_in(page, api) -> None:
    """Through the simple auth manager's login form, as a person would."""
    page.goto(f"{api.base_url}/")
    page.locator("input[name=username]").fill(api.username)
    page.locator("input[name=password]").fill(api.password)
    page.locator("button[type=submit]").click()
    page.wait_for_url(f"{api.base_url}/", timeout=30_000)


def test_watch_the_live_log_and_mark_failed_in_the_browser(api, airflow, page, wait_sacct, tmp_path):
    run_id, ti, job_id = start_job(api, seconds=120)
    seen = ticks(wait_for_ticks(api, run_id, ti["try_number"], at_least=3))

    log_in(page, api)

    # The running task's page opens on its log; the job's lines are there, and new ones keep arriving
    # while the page stays open (a line the job had not printed yet when the page loaded).
    page.goto(f"{api.base_url}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/{TASK_ID}")
    page.get_by_text(f"tick {seen[-1]} of 120", exact=True).wait_for()
    later = seen[-1] + 4
    page.get_by_text(f"tick {later} of 120", exact=True).wait_for(timeout=60_000)
    assert api.task_instance(DAG_ID, run_id, TASK_ID)["state"] == "deferred"

    shot = tmp_path / "live-log.png"
    page.screenshot(path=str(shot))
    print(f"\n[e2e] screenshot: {shot}")
    if os.environ.get("NPA_E2E_SCREENSHOT") == "1":
        DOC_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOC_SCREENSHOT)

    # Mark the task failed through the UI: the menu, then the confirmation dialog.
    page.get_by_role("button", name="Mark Task Instance as...").click()
    page.get_by_role("menuitem", name="Failed").click()
    page.get_by_role("dialog").get_by_role("button", name="Confirm").click()

    api.wait_for_state(DAG_ID, run_id, TASK_ID, {"failed"}, timeout=30)
    wait_sacct(job_id, ("CANCELLED",), timeout=30)


def test_slurm_connection_form_shows_labelled_fields(api, page):
    log_in(page, api)
    page.goto(f"{api.base_url}/connections")
    page.get_by_role("button", name="Add Connection").click()
    dialog = page.get_by_role("dialog")
    dialog.locator("input[aria-autocomplete=list]").fill("Slurm")
    page.keyboard.press("Enter")
    dialog.get_by_text("Slurm (SSH login host)", exact=True).wait_for()
    dialog.get_by_text("Login host(s), comma-separated for failover", exact=True).wait_for()
    dialog.get_by_role("button", name="Extra Fields", exact=True).click()
    labels = ("Private key file", "known_hosts", "Default GPU partition", "Results root (shared storage)")
    for label in (*labels, "CPU partition for image conversion", ".sqsh cache directory", "Job page URL template"):
        dialog.get_by_text(label, exact=True).wait_for()
