"""The gateway's dashboard page in a real headless Chromium: it shows the running job with
its charts (axes with ticks and units, rounded values, values on hover, a colour key for
the queues, loss / KL / entropy / grad norm / validation score), the job's events and
per-service logs, and pause / resume / cancel buttons that work; a wrong or missing token
is a state of its own. Its fleet panel shows an elastic fleet (the real fleet process with
stand-in replicas, gateway_fake_fleet.py) growing on a job's backlog and shrinking on new
bounds: replicas with phase and restarts, the version each serves the job, the scaling block
and the decisions as lines. Screenshots of each state are saved (``MESHRL_SCREENSHOTS`` names the
directory; default the test's tmp dir) for a look by eye."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.dashboard_browser import HeadlessChromium
from services.fleets import FleetDir
from tests.integration.gateway_support import (
    FAKE_FLEET, STANDIN_MODEL, TOKEN, VALID_SPEC, auth, fake_launcher, running_gateway, wait_until,
)  # fmt: skip

pytestmark = pytest.mark.timeout(240)
SIG_DIGITS = re.compile(r"^-?(\d[\d,]*)(\.\d+)?( .*)?$")


def _shots(tmp_path: Path) -> Path:
    return Path(os.environ.get("MESHRL_SCREENSHOTS") or tmp_path / "screens")


def _significant(text: str) -> int:
    """Significant digits of a value as the page prints it ("0.0123 nats" -> 3, "1,234" -> 4)."""
    m = SIG_DIGITS.match(text.strip())
    assert m, f"not a number: {text!r}"
    digits = (m.group(1) + (m.group(2) or "")).replace(",", "").replace(".", "").lstrip("0")
    return len(digits)


def test_dashboard_shows_the_job_its_charts_events_logs_and_controls(tmp_path):
    launcher = fake_launcher(FAKE_STEPS=10_000, FAKE_INTERVAL=0.1, FAKE_SERVICE_LOGS=1, FAKE_WEIGHTS=1)
    shots = _shots(tmp_path)
    with running_gateway(tmp_path, launcher, grpc=False) as gw, HeadlessChromium(tmp_path) as browser:
        with httpx.Client(base_url=gw.http_url, timeout=10) as c:
            job_id = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth()).json()["id"]
        page = browser.open(f"{gw.http_url}/dashboard?interval=200#token={TOKEN}")
        page.set_width()
        card = f'document.querySelector(\'section.job[data-job-id="{job_id}"]\')'
        wait_until(lambda: page.eval(f"!!{card}"), timeout=30, what="the job's card")
        assert page.eval(f"{card}.querySelector('h2').textContent").startswith(job_id)
        assert wait_until(lambda: page.eval(f"{card}.dataset.state") == "running", what="running state")
        assert page.eval("document.body.dataset.auth") == "ok"
        assert page.eval("document.getElementById('fleets').hidden") is True  # no fleet: no panel

        def points(metric: str) -> int:
            return int(page.eval(f"{card}.querySelector('svg[data-metric=\"{metric}\"]').dataset.points"))

        def q(sel: str) -> str:
            return f"{card}.querySelector({json.dumps(sel)})"

        def svg(metric: str) -> str:
            return q('svg[data-metric="' + metric + '"]')

        def fig(metric: str, inner: str) -> str:
            return q('figure[data-metric="' + metric + '"] ' + inner)

        first = wait_until(lambda: points("reward_mean") >= 2 and points("reward_mean"), timeout=30, what="a curve")
        line_before = page.eval(q('svg[data-metric="reward_mean"] polyline') + ".getAttribute('points')")
        polls_before = int(page.eval("document.body.dataset.polls"))
        # The curves grow while the job runs: more points, a different line, more polls.
        wait_until(lambda: points("reward_mean") > first, timeout=30, what="the reward curve to grow")
        assert page.eval(q('svg[data-metric="reward_mean"] polyline') + ".getAttribute('points')") != line_before
        wait_until(lambda: int(page.eval("document.body.dataset.polls")) > polls_before, what="another poll")
        for metric in ("staleness", "tokens_per_s", "loss", "kl", "entropy", "grad_norm"):
            assert points(metric) >= 2, metric
        wait_until(lambda: points("val_score") >= 1, timeout=30, what="a validation score point")

        # Every line runs forward in time (no point drawn twice, whatever polls overlap).
        xs = page.eval(f"[...{card}.querySelectorAll('polyline')].map(l => l.getAttribute('points').split(' ').map(p => +p.split(',')[0]))")
        assert all(a == sorted(a) for a in xs)

        # Axes: y ticks (rounded numbers) and the unit; x ticks as times.
        for metric, unit in (("staleness", "versions"), ("tokens_per_s", "tok/s"), ("entropy", "nats")):
            def ticks(axis: str) -> list[str]:
                return page.eval(f"[...{svg(metric)}.querySelectorAll('text[data-tick={axis}]')].map(t => t.textContent)")

            assert page.eval(f"{svg(metric)}.querySelector('text.unit').textContent") == unit
            times, numbers = ticks("x"), ticks("y")
            assert len(times) >= 3 and all(re.fullmatch(r"\d\d:\d\d:\d\d(\.\d)?", t) for t in times), times
            # y ticks: at least three, distinct, each no longer than its step needs (a "nice" 1-2-5 step)
            assert len(numbers) >= 3 and len(set(numbers)) == len(numbers), numbers
            values = [float(n.replace(",", "")) for n in numbers]
            steps = {round(b - a, 9) for a, b in zip(values, values[1:])}
            assert len(steps) == 1, numbers  # evenly spaced
            step = steps.pop()
            decimals = {len(n.split(".")[1]) if "." in n else 0 for n in numbers}
            assert decimals == {max(0, -math.floor(math.log10(step) + 1e-9))}, numbers  # the step's digits, no float noise
        # The last values are rounded to three significant digits and carry their unit.
        last_tokens = page.eval(q('figure[data-metric="tokens_per_s"] .last') + ".textContent")
        assert last_tokens.endswith(" tok/s") and _significant(last_tokens.split()[0]) <= 3, last_tokens
        last_loss = page.eval(q('figure[data-metric="loss"] .last') + ".textContent")
        assert last_loss and _significant(last_loss) <= 3, last_loss

        # The queues: a line per stream, and a colour key whose colours are the lines'.
        lines = page.eval(f"Object.fromEntries([...{svg('queues')}.querySelectorAll('polyline')]"
                          ".map(l => [l.dataset.line, l.getAttribute('stroke')]))")  # fmt: skip
        assert sorted(lines) == ["experience", "prompts", "rollouts"]
        key = page.eval(f"Object.fromEntries([...{fig('queues', '.legend')}.querySelectorAll('span')]"
                        ".map(s => [s.dataset.line, getComputedStyle(s.querySelector('i')).backgroundColor]))")  # fmt: skip
        assert sorted(key) == sorted(lines) and len(set(key.values())) == 3

        def hex_to_rgb(h: str) -> str:
            return f"rgb({int(h[1:3], 16)}, {int(h[3:5], 16)}, {int(h[5:7], 16)})"

        assert all(key[name] == hex_to_rgb(colour) for name, colour in lines.items())

        # Hovering a chart shows the time and the value under the pointer, rounded, with its unit.
        box = page.eval(f"(() => {{ const r = {svg('tokens_per_s')}.getBoundingClientRect();"
                        " return [r.left, r.top, r.width, r.height]; })()")  # fmt: skip
        page.mouse_move(box[0] + box[2] * 0.6, box[1] + box[3] / 2)
        tip = wait_until(lambda: page.eval(f"(t => t.hidden ? '' : t.textContent)({fig('tokens_per_s', '.tip')})"),
                         what="the hover box")  # fmt: skip
        when, value = tip.split("\n")[:2]
        assert re.fullmatch(r"\d\d:\d\d:\d\d", when) and value.endswith(" tok/s") and _significant(value.split()[0]) <= 3, tip
        assert page.eval(f"{svg('tokens_per_s')}.querySelectorAll('circle.hover').length") == 1

        # The sample ledger the job reports.
        ledger = page.eval(q(".ledger") + ".textContent")
        assert ledger.startswith("samples: fed ") and " · trained " in ledger and "dropped stale" in ledger, ledger

        # The weight plane: each replica's version and role, the canary gate's decisions.
        assert page.eval(q(".weights") + ".dataset.mode") == "canary"
        replicas = page.eval(f"Object.fromEntries([...{card}.querySelectorAll('.weights .replica')]"
                             ".map(s => [s.dataset.replica, [s.dataset.role, s.dataset.version]]))")  # fmt: skip
        assert replicas == {"rollout-0": ["canary", "1"], "rollout-1": ["promoted", "1"]}, replicas
        decisions = page.eval(f"[...{card}.querySelectorAll('.weights li')].map(li => li.dataset.kind + ' v' + li.dataset.version)")
        assert decisions == ["promoted v0", "promoted v1", "rejected v2"], decisions
        rejected = page.eval(q('.weights li[data-kind="rejected"]') + ".textContent")
        assert "v2 rejected: logprob_gap 0.3700" in rejected and "logprob_gap 0.37" in rejected, rejected

        # Events: the job's life so far (with the gate's decisions).
        kinds = page.eval(f"[...{card}.querySelectorAll('.events li')].map(li => li.dataset.kind)")
        assert kinds == ["submitted", "started", "version_promoted", "version_promoted", "version_rejected"], kinds

        # Logs: the driver's by default, then a service picked from the job's logs.
        page.click(f'section.job[data-job-id="{job_id}"] details.logs summary')
        wait_until(lambda: "fake job" in page.eval(q("pre.log") + ".textContent"), what="the driver's log")
        options = wait_until(lambda: (o := page.eval(f"[...{q('details.logs select')}.options].map(o => o.value)")) and len(o) == 3 and o,
                             what="the service list")  # fmt: skip
        assert options == ["job", "rollout-0", "trainer"]
        page.eval(f"(s => {{ s.value = 'trainer'; s.dispatchEvent(new Event('change')); }})({q('details.logs select')})")
        wait_until(lambda: page.eval(q("pre.log") + ".dataset.service") == "trainer"
                   and "trainer: step" in page.eval(q("pre.log") + ".textContent"), what="the trainer's log")  # fmt: skip
        # A progress bar's "\r" rewrites show as the line's last state.
        page.eval(f"(s => {{ s.value = 'rollout-0'; s.dispatchEvent(new Event('change')); }})({q('details.logs select')})")
        wait_until(lambda: page.eval(q("pre.log") + ".dataset.service") == "rollout-0", what="the rollout log")
        text = page.eval(q("pre.log") + ".textContent")
        assert "loading 100%" in text and "loading 0%" not in text and "\r" not in text
        page.eval(f"(s => {{ s.value = 'trainer'; s.dispatchEvent(new Event('change')); }})({q('details.logs select')})")
        wait_until(lambda: page.eval(q("pre.log") + ".dataset.service") == "trainer", what="the trainer's log again")
        page.mouse_move(box[0] + box[2] * 0.6, box[1] + box[3] / 2)  # the hover box in the picture
        page.screenshot(shots / "dashboard-running.png")

        # Controls: only the buttons the state allows; pause, resume, cancel work from the page.
        def visible_buttons() -> list[str]:
            return page.eval(f"[...{card}.querySelectorAll('.actions button')].filter(b => !b.hidden).map(b => b.dataset.action)")

        assert visible_buttons() == ["pause", "cancel"]
        page.click(f'section.job[data-job-id="{job_id}"] button[data-action="pause"]')
        wait_until(lambda: page.eval(f"{card}.dataset.state") == "paused", what="paused state")
        wait_until(lambda: visible_buttons() == ["resume", "cancel"], what="resume button")
        with httpx.Client(base_url=gw.http_url, timeout=10) as c:
            assert c.get(f"/v1/jobs/{job_id}", headers=auth()).json()["state"] == "paused"
        page.screenshot(shots / "dashboard-paused.png")
        xs = page.eval(f"[...{card}.querySelectorAll('polyline')].map(l => l.getAttribute('points').split(' ').map(p => +p.split(',')[0]))")
        assert all(a == sorted(a) for a in xs), "a line runs back in time after a button's poll"
        with httpx.Client(base_url=gw.http_url, timeout=10) as c:
            paused_at = c.get(f"/v1/jobs/{job_id}", headers=auth()).json()["progress"]["step"]
        page.click(f'section.job[data-job-id="{job_id}"] button[data-action="resume"]')
        wait_until(lambda: page.eval(f"{card}.dataset.state") == "running", what="resumed")

        def step_now() -> int:
            with httpx.Client(base_url=gw.http_url, timeout=10) as c:
                return c.get(f"/v1/jobs/{job_id}", headers=auth()).json()["progress"]["step"]

        wait_until(lambda: step_now() > paused_at + 1, timeout=30, what="the resumed job to step on")
        page.click(f'section.job[data-job-id="{job_id}"] button[data-action="cancel"]')
        wait_until(lambda: page.eval(f"{card}.dataset.state") == "cancelled", timeout=30, what="cancelled state")
        wait_until(lambda: visible_buttons() == [], what="no buttons on a finished job")
        with httpx.Client(base_url=gw.http_url, timeout=10) as c:
            assert c.get(f"/v1/jobs/{job_id}", headers=auth()).json()["state"] == "cancelled"
        wait_until(lambda: "cancelled" in page.eval(f"[...{card}.querySelectorAll('.events li')].map(li => li.dataset.kind)"),
                   what="the cancelled event")  # fmt: skip
        assert page.eval("document.getElementById('error').textContent") == ""
        page.screenshot(shots / "dashboard-cancelled.png")
        # The series the gateway recorded never runs backwards, however many readers polled it.
        with httpx.Client(base_url=gw.http_url, timeout=10) as c:
            steps = [p["step"] for p in c.get(f"/v1/jobs/{job_id}/metrics", headers=auth()).json()["points"]]
        assert steps == sorted(steps) and steps[-1] > paused_at + 1, steps  # the points span the pause
        page.close()
    for name in ("dashboard-running.png", "dashboard-paused.png", "dashboard-cancelled.png"):
        assert (shots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (shots / name).stat().st_size > 20_000


def test_dashboard_with_a_wrong_token_says_so_not_no_jobs(tmp_path):
    shots = _shots(tmp_path)
    with running_gateway(tmp_path, fake_launcher(FAKE_STEPS=10_000), grpc=False) as gw, HeadlessChromium(tmp_path) as browser:
        with httpx.Client(base_url=gw.http_url, timeout=10) as c:
            c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth())
        page = browser.open(f"{gw.http_url}/dashboard?interval=200#token=wrong")
        page.set_width()
        wait_until(lambda: page.eval("document.body.dataset.auth") == "refused", timeout=30, what="refused state")
        assert page.eval("document.getElementById('login').hidden") is False
        assert "refused" in page.eval("document.getElementById('error').textContent")
        assert page.eval("document.getElementById('empty').hidden") is True  # never "no jobs yet"
        assert page.eval("document.querySelectorAll('section.job').length") == 0
        page.screenshot(shots / "dashboard-wrong-token.png")
        # Typing the right token shows the job.
        page.eval(f"document.getElementById('token').value = {TOKEN!r}")
        page.click("#login button")
        wait_until(lambda: page.eval("document.querySelectorAll('section.job').length") == 1, what="the job after login")
        assert page.eval("document.body.dataset.auth") == "ok" and page.eval("document.getElementById('login').hidden")
        page.close()
        # No token at all: asks for one, says nothing about jobs.
        page = browser.open(f"{gw.http_url}/dashboard?interval=200&fresh=1")
        page.eval("sessionStorage.clear()")
        page.navigate(f"{gw.http_url}/dashboard?interval=200&fresh=2")
        wait_until(lambda: page.eval("document.readyState === 'complete' && location.search.includes('fresh=2')"),
                   what="reload")  # fmt: skip
        wait_until(lambda: page.eval("document.body.dataset.auth") == "missing", what="missing-token state")
        assert page.eval("document.getElementById('login').hidden") is False
        assert page.eval("document.getElementById('empty').hidden") is True
        assert "token" in page.eval("document.getElementById('error').textContent")
        page.close()


FLEET = {"name": "elastic", "model": {"path": STANDIN_MODEL, "lora_rank": 8},
         "rollout": {"prompt_length": 32, "response_length": 8}, "replicas": 1, "max_jobs": 2,
         "scaling": {"min_replicas": 1, "max_replicas": 3, "interval_s": 0.2, "up_backlog": 4, "down_backlog": 1,
                     "up_after_s": 0.3, "down_after_s": 600, "cooldown_s": 0.5}}  # fmt: skip
FLEET_JOB = "arith-0f0f0f0f"
DECISION = re.compile(r"^\d\d:\d\d:\d\d (add|remove) (\S+) \((.+)\)$")


def test_dashboard_fleet_panel_shows_replicas_versions_scaling_and_decisions(tmp_path):
    shots = _shots(tmp_path)
    fleet_command = [sys.executable, str(FAKE_FLEET)]
    with running_gateway(tmp_path, fake_launcher(), grpc=False, fleet_command=fleet_command) as gw, \
            HeadlessChromium(tmp_path) as browser:  # fmt: skip
        c = httpx.Client(base_url=gw.http_url, headers=auth(), timeout=10)
        assert c.post("/v1/fleets", json={"spec": FLEET}).status_code == 201
        page = browser.open(f"{gw.http_url}/dashboard?interval=200#token={TOKEN}")
        page.set_width()
        sec = "document.querySelector('section.fleet[data-fleet=\"elastic\"]')"
        wait_until(lambda: page.eval(f"!!{sec} && {sec}.dataset.state") == "ready", timeout=30, what="the fleet ready")
        assert page.eval("document.getElementById('fleets').hidden") is False

        def rows() -> dict:
            return page.eval(f"Object.fromEntries([...{sec}.querySelectorAll('tr.replica')].map(r => [r.dataset.replica, "
                             "[r.dataset.phase, r.dataset.restarts, r.querySelector('td.phase').textContent, "
                             "Object.fromEntries([...r.querySelectorAll('td.served')].map(td => [td.dataset.job, "
                             "[td.dataset.state, td.dataset.version, td.textContent]]))]]))")  # fmt: skip

        assert rows() == {"rollout-0": ["serving", "0", "serving", {}], "rollout-1": ["off", "0", "off", {}],
                          "rollout-2": ["off", "0", "off", {}]}, rows()  # fmt: skip
        assert page.eval(f"{sec}.querySelectorAll('li.decision').length") == 0

        # a job with 6 groups waiting (its controller's load.json): the fleet adds rollout-1
        fdir = FleetDir("elastic", gw.fleets.root)
        fdir.attach(FLEET_JOB, {f"rollout-{i}": "x: 1\n" for i in range(3)}, "credential")

        def busy(backlog: int = 6) -> None:
            fdir.write_load(FLEET_JOB, {"prompts": backlog, "leased": 0, "trainer_wait_s": 0.0, "dropped_stale": 0,
                                        "tokens_per_s": 10.0, "version": 2})  # fmt: skip

        def shown(want: dict) -> bool:
            busy()
            return rows() == want

        grown = {"rollout-0": ["serving", "0", "serving", {FLEET_JOB: ["attached", "2", "v2"]}],
                 "rollout-1": ["serving", "0", "serving", {FLEET_JOB: ["attached", "2", "v2"]}],
                 "rollout-2": ["off", "0", "off", {FLEET_JOB: ["", "", "–"]}]}  # fmt: skip
        wait_until(lambda: shown(grown), timeout=40, what=f"rollout-1 serving the job at v2 on the page: {rows()}")
        heads = page.eval(f"[...{sec}.querySelectorAll('table.replicas th[data-job]')].map(t => t.textContent)")
        assert heads == [FLEET_JOB], heads
        # the signals are the fleet's last reading (written with its state every couple of seconds)
        def scaling() -> tuple:
            busy()
            d = page.eval(f"Object.assign({{}}, {sec}.querySelector('.scaling').dataset)")
            return (d["min"], d["max"], d["desired"], d["backlogPerReplica"], d["trainerWait"])

        wait_until(lambda: scaling() == ("1", "3", "2", "3", "0"), timeout=20, what=f"3 per replica: {scaling()}")
        text = page.eval(f"{sec}.querySelector('.scaling').textContent")
        assert text.startswith("scaling: 2 replica(s) desired of 1..3 (backlog)"), text
        assert "backlog 6 group(s), 3.00 per replica" in text, text
        assert "trainer wait 0%" in text and "1 job(s)" in text and "10 tok/s" in text, text
        lines = page.eval(f"[...{sec}.querySelectorAll('li.decision')].map(li => li.textContent)")
        assert len(lines) == 1, lines
        assert DECISION.match(lines[0]).groups() == ("add", "rollout-1", "backlog_high: 6.0 per replica"), lines
        page.screenshot(shots / "dashboard-fleet-grown.png")

        # new bounds (1..1): the fleet drains rollout-1; the page shows it off and the decision
        assert c.patch("/v1/fleets/elastic", json={"max_replicas": 1}).status_code == 200
        wait_until(lambda: page.eval(f"{sec}.querySelector('.scaling').textContent").endswith("bounds 1..1 asked for")
                   or rows()["rollout-1"][0] in ("draining", "off"), what="the new bounds on the page")  # fmt: skip
        shrunk = {**grown, "rollout-1": ["off", "0", "off", {FLEET_JOB: ["detached", "", "detached"]}]}
        wait_until(lambda: shown(shrunk), timeout=40, what=f"rollout-1 drained on the page: {rows()}")
        lines = page.eval(f"[...{sec}.querySelectorAll('li.decision')]"
                          ".map(li => [li.dataset.action, li.dataset.reason, li.textContent])")  # fmt: skip
        assert [ln[:2] for ln in lines] == [["add", "backlog_high"], ["remove", "above_max"]], lines
        assert DECISION.match(lines[1][2]).groups() == ("remove", "rollout-1", "above_max: 2 -> 1 replica(s)"), lines
        assert page.eval(f"{sec}.querySelector('.scaling').dataset.max") == "1"
        assert page.eval("document.getElementById('error').textContent") == ""
        page.screenshot(shots / "dashboard-fleet-shrunk.png")

        # stopped: every replica off, the decisions kept
        fdir.detach(FLEET_JOB)
        assert c.delete("/v1/fleets/elastic").json()["state"] == "stopped"
        wait_until(lambda: page.eval(f"{sec}.dataset.state") == "stopped", what="stopped on the page")
        wait_until(lambda: {r[0] for r in rows().values()} == {"off"}, what="every replica off")
        assert page.eval(f"{sec}.querySelectorAll('li.decision').length") == 2
        c.close()
        page.close()
    for name in ("dashboard-fleet-grown.png", "dashboard-fleet-shrunk.png"):
        assert (shots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
