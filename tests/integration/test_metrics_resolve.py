"""Every Grafana panel, template variable and alert rule reads series that a real job exports.

A short real job (tiny model; controller with the embedded broker and feeder, vLLM rollout
replica, reward worker, FSDP trainer) runs through a real gateway; while it runs the test
scrapes every ``/metrics`` it has: the gateway's (with the token), the controller's
(``metrics_url`` in ``status.json``) and each service's (ports from the run dir's
``config/*.yaml``). Then it takes every PromQL expression of
``deploy/grafana/dashboards/meshrl.json`` and ``deploy/prometheus/alerts.yml``, parses the
metric names (and the labels they aggregate by) out of it, and asserts each one is a series
that was scraped. ``up`` is the one name Prometheus itself makes (one per target).

The job-level series (``JOB_SERIES``: stall flag, restarts, job ledger, queue ledger) are
checked once more from the gateway's ``/metrics`` alone -- the fixed target the shipped
Prometheus configs scrape with the token -- labelled with the job's id.

The same job is the gateway's real job (it was test_gateway_real_job's own, which started a
mesh for it alone): submitted as YAML, the default LocalLauncher runs `meshrl run`; it must
reach `succeeded` with its steps counted, and the gateway must show its metric points.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gateway_svc.launchers.local import LocalLauncher
from tests.integration.gateway_support import TOKEN, auth, running_gateway, wait_until
from tests.fixtures.jobs import tiny_job_spec

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_MADE = {"up"}
#: Series of a whole job: on the gateway's /metrics for every job it runs (label job_id).
JOB_SERIES = ("meshrl_job_stalled", "meshrl_job_service_restarts_total", "meshrl_job_ledger_samples_total",
              "meshrl_ledger_samples")  # series Prometheus itself adds for every target
_FUNCS_AND_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
}  # fmt: skip


def promql_refs(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, labels grouped by) of a PromQL expression. Strings, label matchers and
    range selectors are cut out first; an identifier followed by ``(`` is a function or an
    aggregation; identifiers in ``by (...)`` / ``without (...)`` / ``on (...)`` lists are labels."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    labels: set[str] = set()
    for m in re.finditer(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        labels |= {x.strip() for x in m.group(2).split(",") if x.strip()}
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        word, call = m.group(1), m.group(2)
        if call or word in _FUNCS_AND_WORDS or re.fullmatch(r"\d+[smhdwy]?", word):
            continue
        names.add(word)
    return names, labels


def test_promql_refs_parses_what_the_dashboards_write():
    names, labels = promql_refs(
        'histogram_quantile(0.9, sum by (le) (rate(meshrl_trainer_staleness_versions_bucket{job=~"$job"}[5m])))'
    )
    assert names == {"meshrl_trainer_staleness_versions_bucket"} and labels == {"le"}
    names, labels = promql_refs('increase(meshrl_trainer_steps_total[15m]) == 0 and on(instance) up{job="x"} == 1')
    assert names == {"meshrl_trainer_steps_total", "up"} and labels == {"instance"}
    assert promql_refs("scalar(max(a_b)) - c_d > 2")[0] == {"a_b", "c_d"}


def _expressions() -> list[tuple[str, str]]:
    """(where, expr) of every panel target, template variable query and alert rule."""
    out = []
    dash = json.loads((ROOT / "deploy/grafana/dashboards/meshrl.json").read_text())
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r}", t["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
        inner = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
        out.append((f"variable {v['name']}", inner.group(1) if inner else q))
    for g in yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())["groups"]:
        for r in g["rules"]:
            out.append((f"alert {r['alert']}", r["expr"]))
    return out


def test_every_expression_names_metrics():
    exprs = _expressions()
    assert len(exprs) >= 25
    for where, expr in exprs:
        assert promql_refs(expr)[0], f"{where}: no metric found in {expr!r}"


class Scraper:
    """Scrapes a changing set of /metrics URLs every ``period`` s in a thread; keeps every
    series (name -> label sets) seen and the largest value per (name, labels)."""

    def __init__(self, period: float = 0.5) -> None:
        self.urls: dict[str, dict[str, str]] = {}  # url -> headers
        self.series: dict[str, set[frozenset]] = {}
        self.peak: dict[tuple[str, frozenset], float] = {}
        self.scraped_ok: dict[str, int] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(period,), daemon=True)

    def _run(self, period: float) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        while not self._stop.wait(period):
            for url, headers in list(self.urls.items()):
                try:
                    r = httpx.get(url, headers=headers, timeout=2.0)
                except httpx.HTTPError:
                    continue
                if r.status_code != 200:
                    continue
                self.scraped_ok[url] = self.scraped_ok.get(url, 0) + 1
                for fam in text_string_to_metric_families(r.text):
                    for s in fam.samples:
                        labels = frozenset(s.labels.items())
                        self.series.setdefault(s.name, set()).add(labels)
                        key = (s.name, labels)
                        self.peak[key] = max(self.peak.get(key, float("-inf")), float(s.value))

    def start(self) -> "Scraper":
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=10)

    def peak_of(self, name: str, **labels: str) -> float:
        vals = [v for (n, ls), v in self.peak.items() if n == name and set(labels.items()) <= set(ls)]
        return max(vals) if vals else float("nan")


def _service_urls(run_dir: Path) -> dict[str, str]:
    """Every /metrics URL of the job: the controller's (``status.json``) and each service's,
    from its readiness line (``services.readiness``, the one parser) or, failing that, from
    its view (``config/<service>.yaml``: ``resources.host`` / ``resources.metrics_port``)."""
    from services.readiness import find_ready

    urls = {}
    status = run_dir / "status.json"
    if status.exists():
        try:
            if url := json.loads(status.read_text()).get("metrics_url"):
                urls["controller"] = url
        except ValueError:
            pass
    logs = run_dir / "logs"
    for log in logs.glob("*.log") if logs.exists() else ():
        try:
            ready = find_ready(log.read_text(errors="replace"))
        except ValueError:  # a line cut in half while being written: read again next time
            continue
        if ready is not None and "metrics" in ready.addresses:
            urls[log.stem] = f"http://{ready.address('metrics')}/metrics"
    for cfg in (run_dir / "config").glob("*.yaml") if (run_dir / "config").exists() else ():
        if cfg.stem in urls:
            continue
        raw = yaml.safe_load(cfg.read_text())  # may be half-written: read again next time
        res = raw.get("resources") if isinstance(raw, dict) else None
        if isinstance(res, dict) and res.get("metrics_port"):
            urls[cfg.stem] = f"http://{res.get('host') or '127.0.0.1'}:{res['metrics_port']}/metrics"
    return urls


def _dashboard_of_the_real_job(tmp_path: Path, url: str, job_id: str) -> None:
    """The gateway's dashboard draws the real job's training curves (saved as a screenshot
    in ``MESHRL_SCREENSHOTS`` or the test's tmp dir)."""
    import os

    from tests.integration.dashboard_browser import HeadlessChromium

    with HeadlessChromium(tmp_path) as browser:
        page = browser.open(f"{url}/dashboard?interval=300#token={TOKEN}")
        page.set_width()
        card = f'document.querySelector(\'section.job[data-job-id="{job_id}"]\')'
        wait_until(lambda: page.eval(f"!!{card} && {card}.dataset.state") == "succeeded", timeout=30, what="the card")

        def points(metric: str) -> int:
            return int(page.eval(f"{card}.querySelector('svg[data-metric=\"{metric}\"]').dataset.points"))

        wait_until(lambda: points("loss") >= 1, timeout=30, what="the loss curve")
        for metric in ("reward_mean", "loss", "kl", "entropy", "grad_norm", "queues"):
            assert points(metric) >= 1, metric
        shots = Path(os.environ.get("MESHRL_SCREENSHOTS") or tmp_path / "screens")
        page.click(f'section.job[data-job-id="{job_id}"] details.logs summary')
        wait_until(lambda: page.eval(f"{card}.querySelector('pre.log').textContent.length") > 0, what="the job's log")
        page.screenshot(shots / "dashboard-real-job.png")
        page.close()


def test_every_panel_and_alert_reads_series_a_real_job_exports(tmp_path, tiny_model):
    from services.data import synthetic
    from services.data.parquet import write_rows

    train = write_rows(synthetic.arith_rows(64, seed=0, split="train"), tmp_path / "data" / "train.parquet")
    # 40 steps: long enough for the scraper (every 0.5 s) to see every service while the job
    # runs; on a quiet machine 4 steps took one second, gone before the services were scraped
    spec = tiny_job_spec("metrics-real", tiny_model, train, total_steps=40)
    scraper = Scraper().start()
    # Only the gateway, as the shipped Prometheus configs scrape it (deploy/prometheus/prometheus.yml,
    # deploy/k8s/monitoring.yaml: a fixed target, the token): the job-level series must be there.
    gateway_only = Scraper().start()
    try:
        with running_gateway(tmp_path, LocalLauncher(), grpc=False, input_roots=[tmp_path, Path(tiny_model).parent]) as gw, \
                httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
            scraper.urls[gw.http_url + "/metrics"] = {"Authorization": f"Bearer {TOKEN}"}
            gateway_only.urls[gw.http_url + "/metrics"] = {"Authorization": f"Bearer {TOKEN}"}
            r = c.post("/v1/jobs", content=yaml.safe_dump(spec).encode(),
                       headers={**auth(), "Content-Type": "application/yaml"})  # fmt: skip
            assert r.status_code == 201, r.text
            jid = r.json()["id"]
            run_dir = tmp_path / "runs" / jid

            def finished():
                for name, url in _service_urls(run_dir).items():
                    scraper.urls.setdefault(url, {})
                j = c.get(f"/v1/jobs/{jid}", headers=auth()).json()
                return j if j["state"] in ("succeeded", "failed", "cancelled") else None

            job = wait_until(finished, timeout=800, what="the real job to finish")
            assert job["state"] == "succeeded", job["detail"][-3000:]
            assert job["exit_code"] == 0 and job["progress"]["step"] == 40 and job["progress"]["total_steps"] == 40
            assert c.get(f"/v1/jobs/{jid}/metrics", headers=auth()).json()["points"]
            time.sleep(1.0)  # one more gateway scrape with the final state
            _dashboard_of_the_real_job(tmp_path, gw.http_url, jid)
    finally:
        scraper.stop()
        gateway_only.stop()
    # Every endpoint answered: gateway, controller, trainer, reward-0, rollout-0.
    assert len(scraper.scraped_ok) >= 5, scraper.scraped_ok
    missing = []
    for where, expr in _expressions():
        names, by = promql_refs(expr)
        for name in names - PROMETHEUS_MADE:
            if name not in scraper.series:
                missing.append(f"{where}: {name} (in {expr!r})")
                continue
        have_labels = {k for n in names if n in scraper.series for ls in scraper.series[n] for k, _ in ls}
        for label in by - {"instance", "job"}:  # Prometheus adds job and instance
            if names - PROMETHEUS_MADE and label not in have_labels:
                missing.append(f"{where}: no scraped series of {sorted(names)} has the label {label!r}")
    assert not missing, "series used by the dashboard/alerts but not exported:\n" + "\n".join(missing)
    # ... and the new series carry the job's real numbers, not just zeros.
    assert {dict(ls)["stream"] for ls in scraper.series["meshrl_queue_depth_items"]} == {
        "prompts", "rollouts", "experience"}  # fmt: skip
    assert scraper.peak_of("meshrl_feeder_prompts_total") > 0
    assert scraper.peak_of("meshrl_feeder_max_in_flight_prompts") > 0
    assert scraper.peak_of("meshrl_ledger_samples", stage="trained") > 0
    assert scraper.peak_of("meshrl_trainer_staleness_versions_count") > 0
    assert scraper.peak_of("meshrl_trainer_rollout_probs_diff_max") > 0
    assert scraper.peak_of("meshrl_gateway_jobs", state="succeeded") == 1
    # The job-level series, through the gateway alone, labelled with the job's id.
    for name in JOB_SERIES:
        ids = {dict(ls).get("job_id") for ls in gateway_only.series.get(name, ())}
        assert jid in ids, f"{name} not on the gateway's /metrics for job {jid}: {sorted(gateway_only.series)}"
    assert gateway_only.peak_of("meshrl_job_ledger_samples_total", job_id=jid, stage="trained") > 0
    assert gateway_only.peak_of("meshrl_job_ledger_samples_total", job_id=jid, stage="fed") > 0
    assert gateway_only.peak_of("meshrl_ledger_samples", job_id=jid, stage="trained") > 0
    assert gateway_only.peak_of("meshrl_job_stalled", job_id=jid) == 0
    assert {dict(ls)["service"] for ls in gateway_only.series["meshrl_job_service_restarts_total"]} >= {
        "trainer", "reward-0", "rollout-0"}  # fmt: skip
    # and every alert/panel expression on them resolves with the gateway's series alone
    for where, expr in _expressions():
        names, by = promql_refs(expr)
        if names & set(JOB_SERIES):
            have = {k for n in names for ls in gateway_only.series.get(n, ()) for k, _ in ls}
            assert by - {"instance", "job"} <= have, (where, expr, have)
