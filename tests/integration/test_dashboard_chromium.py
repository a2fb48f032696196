"""The gateway's dashboard page in a real headless Chromium: it loads, shows the running
job, and its curves grow as the job makes progress; a wrong token shows the login box."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.dashboard_browser import HeadlessChromium
from tests.integration.gateway_support import TOKEN, VALID_SPEC, auth, fake_launcher, running_gateway, wait_until

pytestmark = pytest.mark.timeout(180)


def test_dashboard_shows_the_job_and_its_curves_update(tmp_path):
    launcher = fake_launcher(FAKE_STEPS=10_000, FAKE_INTERVAL=0.1)
    with running_gateway(tmp_path, launcher, grpc=False) as gw, HeadlessChromium(tmp_path) as browser:
        with httpx.Client(base_url=gw.http_url, timeout=10) as c:
            job_id = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth()).json()["id"]
        page = browser.open(f"{gw.http_url}/dashboard?interval=200#token={TOKEN}")
        card = f'document.querySelector(\'section.job[data-job-id="{job_id}"]\')'
        wait_until(lambda: page.eval(f"!!{card}"), timeout=30, what="the job's card")
        assert page.eval(f"{card}.querySelector('h2').textContent").startswith(job_id)
        assert wait_until(lambda: page.eval(f"{card}.dataset.state") == "running", what="running state")

        def points(metric: str) -> int:
            return int(page.eval(f"{card}.querySelector('svg[data-metric=\"{metric}\"]').dataset.points"))

        first = wait_until(lambda: points("reward_mean") >= 2 and points("reward_mean"), timeout=30, what="a curve")
        line_before = page.eval(f"{card}.querySelector('svg[data-metric=\"reward_mean\"] polyline').getAttribute('points')")
        polls_before = int(page.eval("document.body.dataset.polls"))
        # The curves grow while the job runs: more points, a different line, more polls.
        wait_until(lambda: points("reward_mean") > first, timeout=30, what="the reward curve to grow")
        assert page.eval(f"{card}.querySelector('svg[data-metric=\"reward_mean\"] polyline').getAttribute('points')") != line_before
        assert int(page.eval("document.body.dataset.polls")) > polls_before
        for metric in ("staleness", "tokens_per_s"):
            assert points(metric) >= 2, metric
        queue_lines = page.eval(
            f"[...{card}.querySelectorAll('svg[data-metric=\"queues\"] polyline')].map(l => l.dataset.line)"
        )
        assert sorted(queue_lines) == ["experience", "prompts", "rollouts"]
        assert page.eval("document.getElementById('error').textContent") == ""

        # Cancelling shows up on the page too.
        with httpx.Client(base_url=gw.http_url, timeout=10) as c:
            assert c.post(f"/v1/jobs/{job_id}:cancel", headers=auth()).status_code == 200
        wait_until(lambda: page.eval(f"{card}.dataset.state") == "cancelled", timeout=30, what="cancelled state")
        page.close()


def test_dashboard_with_a_wrong_token_asks_for_one(tmp_path):
    with running_gateway(tmp_path, fake_launcher(), grpc=False) as gw, HeadlessChromium(tmp_path) as browser:
        page = browser.open(f"{gw.http_url}/dashboard?interval=200#token=wrong")
        wait_until(lambda: page.eval("document.getElementById('login').hidden === false"), timeout=30, what="login box")
        assert "refused" in page.eval("document.getElementById('error').textContent")
        assert page.eval("document.querySelectorAll('section.job').length") == 0
        page.close()
