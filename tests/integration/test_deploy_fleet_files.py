"""A fleet's Kubernetes manifests (deploy/k8s/fleet/), checked offline like the others
(tests/integration/test_deploy_files.py; no cluster here):

* every manifest against the Kubernetes 1.30 schemas (kubernetes-validate, strict), the
  kustomization's patches applied to the base manifests and validated too;
* the HPA scales the replicas' StatefulSet on the metric the fleet's code serves (its name
  read from fleet_svc/fleet.py), within the fleet spec's scaling bounds, with the spec's
  hold times and cool-down as its behavior; a replica gets ``scaling.drain_timeout_s`` to drain;
* the replicas run under the names the fleet's directory uses (``rollout-<i>``,
  ``i < max_replicas``), with the spec's adapter slots, in the fleet's directory;
* the prometheus-adapter's rule serves that metric: its queries name it, pass promtool, and
  a promtool unit test shows the HPA's selector picking the fleet's series;
* Prometheus (the patched k8s config) scrapes the fleet and passes ``promtool check config``;
* every command and flag exists, the spec and the example job validate, the job fits the fleet.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
FLEET = K8S / "fleet"
NOT_LISTED = {"job-example.yaml"}  # created by hand (kubectl create -f), not by the kustomization

pytestmark = pytest.mark.timeout(300)


def docs_in(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@cache
def _fleet_docs() -> tuple[dict, ...]:
    out = []
    for f in sorted(FLEET.glob("*.yaml")):
        if f.name != "kustomization.yaml":
            out += docs_in(f)
    return tuple(out)


def fleet_docs() -> list[dict]:
    return copy.deepcopy(list(_fleet_docs()))


def one(kind: str, name: str | None = None, docs: list[dict] | None = None) -> dict:
    found = [d for d in (docs or fleet_docs()) if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"want one {kind} {name or ''}, found {len(found)}"
    return found[0]


def base_docs() -> list[dict]:
    return [d for f in sorted(K8S.glob("*.yaml")) if f.name != "kustomization.yaml" for d in docs_in(f)]


def kustomization() -> dict:
    return yaml.safe_load((FLEET / "kustomization.yaml").read_text())


def fleet_spec():
    from services.config.fleet import FleetSpec

    return FleetSpec.model_validate(yaml.safe_load(one("ConfigMap", "meshrl-fleet")["data"]["fleet.yaml"]))


def container(doc: dict) -> dict:
    cs = doc["spec"]["template"]["spec"]["containers"]
    assert len(cs) == 1
    return cs[0]


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def fleet_gauges() -> dict[str, str]:
    """The metrics the fleet's process registers: {name: help}, read from its code."""
    src = (ROOT / "fleet_svc" / "fleet.py").read_text()
    return dict(re.findall(r'(?:Gauge|Counter)\(\s*"(meshrl_fleet_[a-z0-9_]+)",\s*"([^"]*)', src))


def backlog_metric() -> str:
    names = [n for n in fleet_gauges() if n.endswith("backlog_per_replica")]
    assert names == ["meshrl_fleet_backlog_per_replica"], f"the fleet's backlog-per-replica gauge: {names}"
    return names[0]


def apply_json_patch(doc: dict, ops: list[dict]) -> dict:
    """The subset of RFC 6902 the kustomization uses: add (``-`` appends) and replace."""
    for op in ops:
        *parents, leaf = [s.replace("~1", "/").replace("~0", "~") for s in op["path"].strip("/").split("/")]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op["op"] == "add" and isinstance(node, list):
            node.append(op["value"]) if leaf == "-" else node.insert(int(leaf), op["value"])
        elif op["op"] in ("add", "replace"):
            if op["op"] == "replace":
                assert (int(leaf) < len(node)) if isinstance(node, list) else leaf in node, op["path"]
            node[int(leaf) if isinstance(node, list) else leaf] = op["value"]
        else:
            raise AssertionError(f"unexpected patch op {op['op']}")
    return doc


def patched_base() -> dict[tuple[str, str], dict]:
    """The base manifests with the kustomization's patches applied (the ones they touch)."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in base_docs()}
    out = {}
    for p in kustomization()["patches"]:
        key = (p["target"]["kind"], p["target"]["name"])
        out[key] = apply_json_patch(out.get(key, docs[key]), yaml.safe_load(p["patch"]))
    return out


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    assert exe, "promtool missing: `scripts/install.sh --test` installs the Debian package `prometheus`"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------- schemas


def test_fleet_manifests_match_the_kubernetes_schemas():
    import kubernetes_validate

    docs = fleet_docs()
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30", strict=True)
    assert sorted(d["kind"] for d in docs) == sorted([
        "ConfigMap", "ConfigMap", "PersistentVolumeClaim", "Deployment", "Service", "StatefulSet", "Service",
        "HorizontalPodAutoscaler", "Job"])  # fmt: skip
    assert one("HorizontalPodAutoscaler")["apiVersion"] == "autoscaling/v2"
    assert one("StatefulSet")["apiVersion"] == "apps/v1"
    k = kustomization()
    assert k["resources"][0] == "..", "the fleet layers on the base deployment (Redis, the model volume, Prometheus)"
    assert sorted(k["resources"][1:]) == sorted(p.name for p in FLEET.glob("*.yaml")
                                                if p.name not in {"kustomization.yaml", *NOT_LISTED})
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            c = container(d)
            assert "livenessProbe" in c and "readinessProbe" in c, d["metadata"]["name"]
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            c = container(d)
            assert c["resources"]["requests"] and c["resources"]["limits"], d["metadata"]["name"]
            assert c["image"] == "meshrl:cpu", "the base's image (deploy/k8s/gpu swaps the tag)"
    # the fleet's directory is shared by every pod of the fleet and its jobs
    pvc = one("PersistentVolumeClaim", "meshrl-fleets")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            pod = d["spec"]["template"]["spec"]
            claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
            assert "meshrl-fleets" in claims, d["metadata"]["name"]
            assert {"name": "fleets", "mountPath": "/fleets"} in container(d)["volumeMounts"]
            assert env_of(container(d))["MESHRL_FLEETS_DIR"]["value"] == "/fleets"
    # the patched base manifests are still valid
    for doc in patched_base().values():
        kubernetes_validate.validate(doc, "1.30", strict=True)


def test_fleet_schema_check_can_fail():
    import kubernetes_validate

    hpa = one("HorizontalPodAutoscaler")
    hpa["spec"]["behavior"]["scaleUp"]["policies"][0]["value"] = "one"  # an integer
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hpa, "1.30", strict=True)
    sts = one("StatefulSet")
    sts["spec"]["template"]["spec"]["terminationGracePeriod"] = 60  # misspelt: strict refuses it
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, "1.30", strict=True)


# ---------------------------------------------------------------------------------------------- the HPA


def test_the_hpa_scales_the_replicas_on_the_fleets_metric_within_its_bounds():
    spec = fleet_spec()
    sc = spec.scaling
    hpa = one("HorizontalPodAutoscaler")["spec"]
    sts = one("StatefulSet")
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"]}
    assert spec.elastic, "the k8s fleet's spec should be elastic (max_replicas above min_replicas)"
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == sc.bounds(spec.replicas)
    assert "replicas" not in sts["spec"], "the HPA owns the count: `kubectl apply` would reset a fixed one"
    (metric,) = hpa["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == backlog_metric()
    assert metric["external"]["metric"]["selector"] == {"matchLabels": {"fleet": spec.name}}
    # the metric is per replica already: a Value target is the spec's up threshold
    assert metric["external"]["target"]["type"] == "Value"
    assert float(metric["external"]["target"]["value"]) == sc.up_backlog
    # the fleet's hysteresis and cool-down: hold times as stabilization windows, one replica
    # per cool-down each way
    up, down = hpa["behavior"]["scaleUp"], hpa["behavior"]["scaleDown"]
    assert up["stabilizationWindowSeconds"] == round(sc.up_after_s)
    assert down["stabilizationWindowSeconds"] == round(sc.down_after_s)
    for rules in (up, down):
        assert rules["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": round(sc.cooldown_s)}]
    # a replica gets the spec's drain time between SIGTERM and SIGKILL (no preStop hook eats into it)
    pod = sts["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= sc.drain_timeout_s
    assert "lifecycle" not in container(sts), "a preStop hook's time counts against the grace period"


def test_the_hpa_check_can_fail():
    """The same comparisons on a spec whose bounds moved: they no longer hold."""
    spec = fleet_spec()
    hpa = one("HorizontalPodAutoscaler")["spec"]
    moved = spec.scaling.model_copy(update={"max_replicas": hpa["maxReplicas"] + 1})
    assert (hpa["minReplicas"], hpa["maxReplicas"]) != moved.bounds(spec.replicas)
    src = (ROOT / "fleet_svc" / "fleet.py").read_text().replace("meshrl_fleet_backlog_per_replica",
                                                                 "meshrl_fleet_backlog_per_serving_replica")
    renamed = dict(re.findall(r'(?:Gauge|Counter)\(\s*"(meshrl_fleet_[a-z0-9_]+)",\s*"([^"]*)', src))
    assert hpa["metrics"][0]["external"]["metric"]["name"] not in renamed


def test_the_fleets_scaling_block_is_what_the_manifests_mirror():
    """The HPA mirrors every key of the fleet's scaling block (or docs/deploy.md says why not).
    A new key -- a switch that hands the count to an external autoscaler, say -- must be set in
    the k8s spec and the gap list in docs/deploy.md updated: this fails until then."""
    from services.config.fleet import FleetScaling

    assert set(FleetScaling.model_fields) == {"min_replicas", "max_replicas", "interval_s", "up_backlog",
                                              "down_backlog", "up_after_s", "down_after_s", "cooldown_s",
                                              "drain_timeout_s"}  # fmt: skip
    doc = (ROOT / "docs" / "deploy.md").read_text()
    assert "## Fleets on Kubernetes" in doc
    section = doc.split("## Fleets on Kubernetes", 1)[1].split("\n## ", 1)[0]
    for key in ("down_backlog", "drain_timeout_s", "cooldown_s", "meshrl_fleet_backlog_per_replica"):
        assert key in section, key


# ---------------------------------------------------------------------------------------------- the replicas


def test_the_replicas_run_under_the_fleets_replica_names():
    from services.fleets import FleetDir

    spec = fleet_spec()
    sts = one("StatefulSet")
    c = container(sts)
    cmd = c["command"]
    assert cmd[:3] == ["python", "-m", "rollout_svc"]

    def flag(name: str) -> str:
        return cmd[cmd.index(name) + 1]

    # pod i of the StatefulSet is replica rollout-<i>, i from the pod's index label
    index = env_of(c)["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert index == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert flag("--id") == "rollout-$(POD_INDEX)"
    hpa = one("HorizontalPodAutoscaler")["spec"]
    names = {flag("--id").replace("$(POD_INDEX)", str(i)) for i in range(hpa["maxReplicas"])}
    assert names == set(spec.replica_names()), "every pod the HPA may run is a replica the jobs hand views to"
    fdir = FleetDir(spec.name, env_of(c)["MESHRL_FLEETS_DIR"]["value"])
    assert flag("--fleet-dir") == str(fdir.path)
    assert int(flag("--adapter-slots")) == spec.max_jobs
    # the view is the one the fleet's process writes for the replica (Fleet.views)
    assert flag("--config") == str(fdir.path / "config" / "rollout-$(POD_INDEX).yaml")
    assert 'self.fdir.path / "config" / f"{name}.yaml"' in (ROOT / "fleet_svc" / "fleet.py").read_text()
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    svc = one("Service", sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    # its port: the override on the command line, the container's, the probes', the Service's
    overrides = dict(w.split("=", 1) for w in cmd if re.fullmatch(r"[a-z_]+(\.[a-z_]+)+=\S+", w))
    port = int(overrides["resources.metrics_port"])
    assert {p["containerPort"] for p in c["ports"]} == {port}
    assert {p["port"] for p in svc["spec"]["ports"]} == {port}
    assert overrides["resources.host"] == "0.0.0.0"
    # vLLM's shared memory, as the job replicas get
    shm = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory" and {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_the_replicas_overrides_apply_to_the_fleets_view(tmp_path):
    """The fleet process's view for a replica, with the StatefulSet's overrides, loads."""
    from services.config.views import RolloutProcess, RolloutView, load_view, write_view

    spec = fleet_spec()
    res = RolloutProcess(device=spec.services.device, host=spec.services.host, metrics_port=41234)
    view = RolloutView(model=spec.model, rollout=spec.rollout, resources=res)
    path = write_view(view, tmp_path / "rollout-0.yaml")
    cmd = container(one("StatefulSet"))["command"]
    overrides = [w for w in cmd if re.fullmatch(r"[a-z_]+(\.[a-z_]+)+=\S+", w)]
    got = load_view(RolloutView, path, overrides)
    assert got.resources.metrics_port == int(dict(o.split("=", 1) for o in overrides)["resources.metrics_port"])
    assert got.resources.host == "0.0.0.0" and got.model.path == spec.model.path


def test_the_fleet_process_serves_its_metrics_where_prometheus_looks():
    spec = fleet_spec()
    dep = one("Deployment", "meshrl-fleet")
    c = container(dep)
    assert c["command"] == ["meshrl", "fleet", "start", "/etc/meshrl-fleet/fleet.yaml", "--fleets-dir", "/fleets"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vol = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == mounts["/etc/meshrl-fleet"])
    assert vol["configMap"]["name"] == "meshrl-fleet"
    assert spec.services.host == "0.0.0.0", "the fleet's /metrics must bind every address in its pod"
    assert {p["containerPort"] for p in c["ports"]} == {spec.services.metrics_port}
    svc = one("Service", "meshrl-fleet")
    assert {p["port"] for p in svc["spec"]["ports"]} == {spec.services.metrics_port}
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    # SIGTERM: the fleet stops its replicas, each with 30 s to hand back what it holds
    src = (ROOT / "fleet_svc" / "fleet.py").read_text()
    stop_all = src.split("def _stop_all", 1)[1].split("\n    def ", 1)[0]
    graces = [float(g) for g in re.findall(r"""["']?grace["']?\s*[:=]\s*([0-9.]+)""", stop_all)]
    assert graces, "Fleet._stop_all gives each replica a grace period"
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > max(graces)


# ---------------------------------------------------------------------------------------------- Prometheus


def test_prometheus_scrapes_the_fleet_and_passes_promtool(tmp_path):
    spec = fleet_spec()
    base = next(d for d in base_docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "meshrl-prometheus")
    cm = patched_base()[("ConfigMap", "meshrl-prometheus")]
    cfg = cm["data"]["prometheus.yml"]
    (tmp_path / "token").write_text("x")
    (tmp_path / "alerts.yml").write_text((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    (tmp_path / "prometheus.yml").write_text(cfg.replace("/run/secrets/gateway/token", str(tmp_path / "token"))
                                             .replace("/etc/prometheus/rules/alerts.yml", "alerts.yml"))
    r = _promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    # the base's jobs unchanged, and one more
    ours, theirs = yaml.safe_load(cfg), yaml.safe_load(base["data"]["prometheus.yml"])
    assert {k: v for k, v in ours.items() if k != "scrape_configs"} == {k: v for k, v in theirs.items()
                                                                        if k != "scrape_configs"}
    assert ours["scrape_configs"][:-1] == theirs["scrape_configs"]
    job = ours["scrape_configs"][-1]
    assert job["job_name"] == "meshrl-fleet"
    (st,) = job["static_configs"]
    assert st["targets"] == [f"meshrl-fleet:{spec.services.metrics_port}"]
    assert st["labels"] == {"fleet": spec.name}
    # and the job's fence lets Prometheus reach that port
    pol = patched_base()[("NetworkPolicy", "meshrl-internal")]
    prom_rule = next(r for r in pol["spec"]["ingress"] if r["from"][0]["podSelector"]["matchLabels"] ==
                     {"app.kubernetes.io/part-of": "meshrl-monitoring"})
    assert {"protocol": "TCP", "port": spec.services.metrics_port} in prom_rule["ports"]
    for d in fleet_docs():
        if d["kind"] in ("Deployment", "StatefulSet"):
            assert d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "meshrl"


def test_the_patched_prometheus_config_check_can_fail(tmp_path):
    cfg = patched_base()[("ConfigMap", "meshrl-prometheus")]["data"]["prometheus.yml"]
    (tmp_path / "prometheus.yml").write_text(cfg.replace("scrape_interval: 5s", "scrape_interval: five"))
    assert _promtool("check", "config", "prometheus.yml", cwd=tmp_path).returncode != 0


# ---------------------------------------------------------------------------------------------- the adapter


def adapter_rule() -> dict:
    cfg = yaml.safe_load(one("ConfigMap", "meshrl-fleet-prometheus-adapter")["data"]["config.yaml"])
    assert set(cfg) == {"externalRules"}
    (rule,) = cfg["externalRules"]
    return rule


def adapter_query(rule: dict, selector: dict[str, str]) -> str:
    """The PromQL the adapter sends for an HPA whose External metric selects ``selector``
    (its template with the series, the label matchers and the group-by filled in)."""
    series = rule["seriesQuery"].split("{", 1)[0]
    matchers = ",".join(f'{k}="{v}"' for k, v in sorted(selector.items()))
    return (rule["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)
            .replace("<<.GroupBy>>", ",".join(sorted(selector))))


def test_the_adapter_serves_the_fleets_metric_to_the_hpa(tmp_path):
    metric = backlog_metric()
    rule = adapter_rule()
    hpa_metric = one("HorizontalPodAutoscaler")["spec"]["metrics"][0]["external"]["metric"]
    assert re.fullmatch(rule["name"]["matches"], metric)
    assert re.sub(rule["name"]["matches"], rule["name"]["as"], metric) == hpa_metric["name"]
    assert rule["seriesQuery"].startswith(metric + "{") and "<<.Series>>" in rule["metricsQuery"]
    assert '{job="meshrl-fleet",' in rule["seriesQuery"]
    assert rule["resources"] == {"namespaced": False}, "the scraped series carries no namespace label"
    # the queries parse (as promtool parses rules), and select what the HPA wants: a unit test
    # with two fleets' series, the HPA's selector picking smol's
    selector = hpa_metric["selector"]["matchLabels"]
    rules = {"groups": [{"name": "adapter", "rules": [
        {"record": "adapter:series", "expr": f"count({rule['seriesQuery']})"},
        {"record": "adapter:value", "expr": adapter_query(rule, selector)}]}]}  # fmt: skip
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    r = _promtool("check", "rules", "rules.yml", cwd=tmp_path)
    assert r.returncode == 0 and "2 rules found" in r.stdout, r.stdout + r.stderr
    other = "other" if selector["fleet"] != "other" else "else"
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [
            {"series": f'{metric}{{job="meshrl-fleet",fleet="{selector["fleet"]}",instance="meshrl-fleet:9105"}}',
             "values": "0 2 6 6"},
            {"series": f'{metric}{{job="meshrl-fleet",fleet="{other}",instance="x:9105"}}', "values": "9 9 9 9"},
            {"series": f'{metric}{{job="somewhere-else",fleet="{selector["fleet"]}"}}', "values": "7 7 7 7"}],
        "promql_expr_test": [
            {"expr": "adapter:value", "eval_time": "30s", "exp_samples": [
                {"labels": f'adapter:value{{fleet="{selector["fleet"]}"}}', "value": 6}]},
            {"expr": "adapter:series", "eval_time": "0s",
             "exp_samples": [{"labels": "adapter:series", "value": 2}]}]}]}  # fmt: skip
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    r = _promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    # ... and the same test fails when the rule does not pick the fleet by the HPA's selector
    broken = copy.deepcopy(rules)
    broken["groups"][0]["rules"][1]["expr"] = adapter_query(rule, {})
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(broken))
    assert _promtool("test", "rules", "test.yml", cwd=tmp_path).returncode != 0


# ---------------------------------------------------------------------------------------------- names exist


def test_every_command_and_flag_exists():
    cmds = [container(d)["command"] for d in fleet_docs() if d["kind"] in ("Deployment", "StatefulSet", "Job")]
    seen = set()
    for cmd in cmds:
        if cmd[:2] == ["python", "-m"]:
            target, argv = cmd[2], [sys.executable, "-m", cmd[2], "--help"]
            rest = cmd[3:]
        else:
            assert cmd[0] == "meshrl", cmd
            sub = cmd[1:3] if cmd[1] == "fleet" else cmd[1:2]
            target, argv = " ".join(sub), [sys.executable, "-m", "meshrl_cli", *sub, "--help"]
            rest = cmd[1 + len(sub):]
        r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{' '.join(argv)} failed: {r.stderr[-2000:]}"
        for word in rest:
            if word.startswith("--"):
                assert re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", r.stdout), f"{target} has no flag {word}"
        seen.add(target)
    assert seen == {"rollout_svc", "fleet start", "run"}
    # every MESHRL_* variable they set is read by the code
    code = "\n".join(p.read_text() for d in ("services", "fleet_svc", "controller_svc", "meshrl_cli")
                     for p in (ROOT / d).rglob("*.py"))
    for var in set(re.findall(r"\b(MESHRL_[A-Z_]+)\b", "\n".join(p.read_text() for p in FLEET.glob("*.yaml")))):
        assert f'"{var}"' in code, f"{var} is set by a fleet manifest but read nowhere in the code"


def test_the_spec_follows_the_example_fleet_and_the_example_job_fits_it():
    from services.config.fleet import FleetSpec, attach_problems
    from services.config.job import parse_job
    from services.config.views import derive_views

    spec = fleet_spec()
    example = FleetSpec.model_validate(yaml.safe_load((ROOT / "examples" / "fleet.yaml").read_text()))
    assert spec.name == example.name
    assert spec.rollout == example.rollout, "the k8s fleet runs examples/fleet.yaml's engine"
    for key in ("lora_rank", "dtype"):
        assert getattr(spec.model, key) == getattr(example.model, key), key
    assert (spec.replicas, spec.max_jobs) == (example.replicas, example.max_jobs)
    # its model is where the base deployment's model volume has it
    job_cm = next(d for d in base_docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "meshrl-job")
    assert spec.model.path == yaml.safe_load(job_cm["data"]["job.yaml"])["model"]["path"]
    # the replicas' engine memory is the spec's
    env = env_of(container(one("StatefulSet")))
    assert int(env["VLLM_CPU_KVCACHE_SPACE"]["value"]) == int(max(1, spec.rollout.kv_cache_space_gib or 1))
    # the example job: valid, on this fleet, and a fleet replica would take it
    job = parse_job(yaml.safe_load(one("ConfigMap", "meshrl-fleet")["data"]["job.yaml"]))
    assert job.services.rollout.fleet == spec.name and job.model.lora_rank > 0
    assert attach_problems(spec, derive_views(job)["rollout"]) == []
    run = container(one("Job"))["command"]
    assert run[:3] == ["meshrl", "run", "/etc/meshrl-fleet/job.yaml"]
    assert job.queues.type == "redis" and job.queues.url.endswith("/1"), "not the gateway's database (it empties 0)"
