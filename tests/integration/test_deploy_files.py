"""The deployment files, checked offline (no Docker engine, no cluster here):

* docker-compose.yml against the compose-spec JSON schema (vendored by check-jsonschema);
* deploy/k8s/*.yaml against the Kubernetes OpenAPI schemas (kubernetes-validate, strict);
* deploy/prometheus with promtool (check config, check rules, test rules);
* and that every command, flag, port, env var, image and file they name exists in the code.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from services.config.job import parse_job

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s"
PROM = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
CODE_DIRS = ("services", "rollout_svc", "reward_svc", "trainer_svc", "feeder_svc", "controller_svc", "gateway_svc",
             "worker_svc", "meshrl_cli")

pytestmark = pytest.mark.timeout(300)


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def k8s_docs() -> list[dict]:
    docs = []
    for f in sorted(K8S.glob("*.yaml")):
        if f.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def k8s_containers(init: bool = False) -> list[dict]:
    out = []
    for d in k8s_docs():
        if d["kind"] in ("Deployment", "Job"):
            pod = d["spec"]["template"]["spec"]
            out += pod["containers"] + (pod.get("initContainers", []) if init else [])
    return out


def compose_job():
    return parse_job(yaml.safe_load((ROOT / "deploy" / "config" / "job.yaml").read_text()))


def k8s_job():
    cm = next(d for d in k8s_docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "meshrl-job")
    return parse_job(yaml.safe_load(cm["data"]["job.yaml"]))


@cache
def code_text() -> str:
    return "\n".join(p.read_text() for d in CODE_DIRS for p in (ROOT / d).rglob("*.py"))


@cache
def defined_metrics() -> set[str]:
    """Every metric name the code registers, with the suffixes prometheus_client adds."""
    names = set(re.findall(r'"(meshrl_[a-z0-9_]+)"', code_text()))
    out = set()
    for n in names:
        out |= {n, f"{n}_total", f"{n}_sum", f"{n}_count", f"{n}_bucket"}
    return out


def promql_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b(meshrl_[a-z0-9_]+)", expr))


# ---------------------------------------------------------------------------------------------- schemas


def test_compose_file_matches_the_compose_spec():
    import jsonschema
    from check_jsonschema.builtin_schemas import vendor

    schema = json.loads((Path(vendor.__file__).parent / "compose-spec.json").read_text())
    jsonschema.validate(compose(), schema)
    services = compose()["services"]
    assert {"redis", "gateway", "trainer", "rollout", "reward", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        if name != "prepare":
            assert "healthcheck" in svc, f"{name} has no health check"
    assert services["rollout"]["deploy"]["replicas"] >= 2
    assert "/etc/meshrl/job.yaml" in " ".join(services["trainer"]["volumes"])


def test_compose_schema_check_can_fail():
    import jsonschema
    from check_jsonschema.builtin_schemas import vendor

    schema = json.loads((Path(vendor.__file__).parent / "compose-spec.json").read_text())
    bad = compose()
    bad["services"]["gateway"]["healthcheck"]["interval"] = ["not", "a", "duration"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_k8s_manifests_match_the_kubernetes_schemas():
    import kubernetes_validate

    docs = k8s_docs()
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30", strict=True)
    kinds = {d["kind"] for d in docs}
    assert {"ConfigMap", "PersistentVolumeClaim", "Deployment", "Service"} <= kinds
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            assert "livenessProbe" in c and "readinessProbe" in c, c["name"]
            assert c["resources"]["requests"] and c["resources"]["limits"], c["name"]
    trainer = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "meshrl-trainer")
    claims = [v["persistentVolumeClaim"]["claimName"] for v in trainer["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v]  # fmt: skip
    assert "meshrl-checkpoints" in claims


def test_k8s_schema_check_can_fail():
    import kubernetes_validate

    doc = next(d for d in k8s_docs() if d["kind"] == "Deployment")
    doc["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, "1.30", strict=True)


# ---------------------------------------------------------------------------------------------- promtool


def _promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    assert exe, "promtool missing: `scripts/install.sh --test` installs the Debian package `prometheus`"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_prometheus_config_and_rules_pass_promtool(tmp_path):
    # The full check, as the file's header names it, from anywhere (it opens the files the
    # config names: the gateway token's stand-in is in the repository, empty; compose mounts
    # the real secret over it).
    r = _promtool("check", "config", str(PROM / "prometheus.yml"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (PROM / "gateway_token").read_bytes() == b"", "never commit a real token"
    prom = yaml.safe_load((PROM / "prometheus.yml").read_text())
    gw = next(sc for sc in prom["scrape_configs"] if sc["job_name"] == "meshrl-gateway")
    secret = next(s for s in compose()["services"]["prometheus"]["secrets"] if isinstance(s, dict))
    assert secret["target"] == "/etc/prometheus/" + gw["authorization"]["credentials_file"]
    r = _promtool("check", "rules", "alerts.yml")
    assert r.returncode == 0 and "8 rules found" in r.stdout, r.stdout + r.stderr


def test_alert_rules_fire_as_their_unit_tests_say(tmp_path):
    r = _promtool("test", "rules", "alerts_test.yml")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    names = {rule["alert"] for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"] for rule in g["rules"]}
    tested = set(re.findall(r"alertname: (\w+)", (PROM / "alerts_test.yml").read_text()))
    assert names == tested == {"MeshrlTrainerDown", "MeshrlTrainerStalled", "MeshrlReplicaServingOldVersion",
                               "MeshrlQueueGrowing", "MeshrlLogprobGapDrift", "MeshrlJobStalled",
                               "MeshrlServiceRestarting", "MeshrlCanaryRejected"}  # fmt: skip
    # ... and a broken rule makes the same tests fail (the check can fail).
    broken = (PROM / "alerts.yml").read_text().replace("> 2", "> 100")
    (tmp_path / "alerts.yml").write_text(broken)
    shutil.copy(PROM / "alerts_test.yml", tmp_path / "alerts_test.yml")
    assert _promtool("test", "rules", "alerts_test.yml", cwd=tmp_path).returncode != 0


def test_every_metric_the_dashboards_and_alerts_use_exists_and_is_documented():
    exprs = [r["expr"] for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"] for r in g["rules"]]
    dash = json.loads((GRAFANA / "dashboards" / "meshrl.json").read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = set().union(*(promql_metrics(e) for e in exprs))
    assert used, "no metrics found"
    missing = used - defined_metrics()
    assert not missing, f"metrics used but never defined in the code: {sorted(missing)}"
    doc = (ROOT / "docs" / "metrics.md").read_text()
    undocumented = {m for m in used if re.sub(r"_(total|sum|count|bucket)$", "", m) not in doc and m not in doc}
    assert not undocumented, f"metrics missing from docs/metrics.md: {sorted(undocumented)}"
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert all(p["datasource"]["uid"] == ds["uid"] for p in dash["panels"])


# ---------------------------------------------------------------------------------------------- names exist


def _commands() -> list[list[str]]:
    cmds = []
    for name, svc in compose()["services"].items():
        cmd = svc.get("command")
        if isinstance(cmd, list):
            cmds.append(cmd)
    for c in k8s_containers(init=True):
        cmds.append([*c.get("command", []), *c.get("args", [])])
    return cmds


def _python_invocations() -> list[tuple[str, list[str]]]:
    """(module or 'meshrl <sub>', its flags) for every command named anywhere (shell strings too)."""
    found = []
    texts = [" ".join(c) for c in _commands()]
    texts.append("\n".join(ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")))
    for text in texts:
        for m in re.finditer(r"python -m ([\w.]+)((?: (?:--?[\w-]+|[^\s;&|]+))*)", text):
            found.append((m.group(1), re.findall(r"(--[\w-]+)", m.group(2))))
        for m in re.finditer(r"\bmeshrl ([\w-]+)((?: (?:--?[\w-]+|[^\s;&|\"\]]+))*)", text):
            own = (m.group(2) + " ").split(" -- ")[0]  # after " -- ": the command a `meshrl worker` runs
            found.append((f"meshrl {m.group(1)}", re.findall(r"(--[\w-]+)", own)))
    return found


def test_every_command_and_flag_exists():
    inv = _python_invocations()
    modules = {m for m, _ in inv if not m.startswith("meshrl ")}
    assert {"trainer_svc", "rollout_svc", "reward_svc", "feeder_svc"} <= modules
    helps: dict[str, str] = {}
    for target, flags in inv:
        if target not in helps:
            if target.startswith("meshrl "):
                argv = [sys.executable, "-m", "meshrl_cli", target.split()[1], "--help"]
            else:
                assert importlib.util.find_spec(target) is not None, f"no module {target}"
                argv = [sys.executable, "-m", target, "--help"]
            r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, f"{' '.join(argv)} failed: {r.stderr[-2000:]}"
            helps[target] = r.stdout
        for flag in flags:
            assert flag in helps[target], f"{target} has no flag {flag}"


def test_ports_match_the_job_config_and_the_code():
    from gateway_svc import main as gateway_cli
    from gateway_svc import server

    assert gateway_cli.DEFAULT_HTTP_PORT == server.DEFAULT_HTTP_PORT == 8600
    assert gateway_cli.DEFAULT_GRPC_PORT == server.DEFAULT_GRPC_PORT == 8601
    for job in (compose_job(), k8s_job()):
        sv = job.services
        ports = {
            "rollout": {sv.rollout.metrics_port, sv.rollout.grpc_port},
            "reward": {sv.reward.metrics_port, sv.reward.grpc_port},
            "trainer": {sv.trainer.metrics_port, job.weights.control_port, job.weights.rendezvous_port},
            "feeder": {sv.feeder.metrics_port},
        }
        assert all(p for s in ports.values() for p in s), "deployment job configs must fix every port"
        assert sv.host == "0.0.0.0", "services must bind every address inside a container"
    job = compose_job()
    sv = job.services
    services = compose()["services"]
    for name, want in {"rollout": {sv.rollout.metrics_port, sv.rollout.grpc_port},
                       "reward": {sv.reward.metrics_port, sv.reward.grpc_port},
                       "trainer": {sv.trainer.metrics_port, job.weights.control_port, job.weights.rendezvous_port},
                       "feeder": {sv.feeder.metrics_port},
                       }.items():  # fmt: skip
        assert {int(p) for p in services[name]["expose"]} == want, name
    hc = {n: " ".join(s["healthcheck"]["test"]) for n, s in services.items() if "healthcheck" in s}
    assert f":{sv.rollout.metrics_port}/" in hc["rollout"] and f":{sv.reward.metrics_port}/" in hc["reward"]
    assert f":{sv.trainer.metrics_port}/" in hc["trainer"] and ":8600/" in hc["gateway"]
    assert f":{sv.feeder.metrics_port}/" in hc["feeder"]
    assert services["gateway"]["ports"] == ["8600:8600", "8601:8601"]
    # Prometheus scrapes the same ports.
    prom = yaml.safe_load((PROM / "prometheus.yml").read_text())
    targets = {}
    for sc in prom["scrape_configs"]:
        for st in sc.get("static_configs", []):
            targets[sc["job_name"]] = {int(t.rsplit(":", 1)[1]) for t in st["targets"]}
        for dns in sc.get("dns_sd_configs", []):
            targets[sc["job_name"]] = {dns["port"]}
    assert targets == {"meshrl-gateway": {8600}, "meshrl-trainer": {sv.trainer.metrics_port},
                       "meshrl-rollout": {sv.rollout.metrics_port}, "meshrl-reward": {sv.reward.metrics_port},
                       "meshrl-feeder": {sv.feeder.metrics_port}}  # fmt: skip
    # The image exposes every one of them.
    exposed = {int(p) for line in DOCKERFILE.read_text().splitlines() if line.startswith("EXPOSE") for p in line.split()[1:]}
    assert set().union(*targets.values(), {8601, sv.rollout.grpc_port, sv.reward.grpc_port,
                                           job.weights.control_port, job.weights.rendezvous_port}) <= exposed  # fmt: skip
    # Kubernetes containerPorts equal the ConfigMap job's ports.
    kjob = k8s_job()
    ks = kjob.services
    by_name = {c["name"]: {p["containerPort"] for p in c.get("ports", [])} for c in k8s_containers()}
    assert by_name["rollout"] == {ks.rollout.metrics_port, ks.rollout.grpc_port}
    assert by_name["reward"] == {ks.reward.metrics_port, ks.reward.grpc_port}
    assert by_name["trainer"] == {ks.trainer.metrics_port, kjob.weights.control_port, kjob.weights.rendezvous_port}
    assert by_name["gateway"] == {8600, 8601} and by_name["feeder"] == {ks.feeder.metrics_port}


def test_env_vars_images_and_files_exist():
    texts = [COMPOSE.read_text(), DOCKERFILE.read_text(), *(p.read_text() for p in K8S.glob("*.yaml"))]
    env_vars = set().union(*(re.findall(r"\b(MESHRL_[A-Z_]+)\b", t) for t in texts))
    assert env_vars
    for var in env_vars:
        assert f'"{var}"' in code_text(), f"{var} is set by a deployment file but read nowhere in the code"
    # Our image: built from deploy/Dockerfile's `cpu` stage; every k8s container uses it; third-party images pinned.
    stages = set(re.findall(r"^FROM \S+ AS (\w+)", DOCKERFILE.read_text(), flags=re.M))
    assert {"cpu", "cuda"} <= stages
    services = compose()["services"]
    for name, svc in services.items():
        image = svc["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image tag"
        if image.startswith("meshrl:"):
            assert svc["build"]["dockerfile"] == "deploy/Dockerfile" and svc["build"]["target"] in stages
            assert image == f"meshrl:{svc['build']['target']}"
    for c in k8s_containers():
        assert c["image"] == "meshrl:cpu" or not c["image"].startswith("meshrl"), c["image"]
        assert ":" in c["image"] and not c["image"].endswith(":latest")
    # Files the compose file mounts, and files the Dockerfile copies, exist.
    for svc in services.values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("./"):
                assert (ROOT / src).exists(), src
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), src
    # The gateway's token comes from the environment it says.
    assert "MESHRL_GATEWAY_TOKEN" in services["gateway"]["environment"]


# ---------------------------------------------------------------------------------------------- roles, GPUs, wiring

WORKER_SERVICES = ("trainer", "rollout", "reward", "feeder")


def test_restart_policies_match_each_service_role():
    services = compose()["services"]
    assert services["prepare"]["restart"] == "no"  # one-off
    for name in WORKER_SERVICES:  # restart only when they fail: a finished job never restart-loops
        assert services[name]["restart"] == "on-failure", name
    for name in ("redis", "gateway", "prometheus", "grafana"):
        assert services[name]["restart"] == "unless-stopped", name


def test_every_long_running_meshrl_service_has_cpu_and_memory_limits():
    services = compose()["services"]
    for name in ("gateway", *WORKER_SERVICES):
        limits = services[name].get("deploy", {}).get("resources", {}).get("limits", {})
        assert set(limits) >= {"cpus", "memory"}, f"{name}: deploy.resources.limits needs cpus and memory"
        assert 0 < float(limits["cpus"]) <= 2, f"{name}: cpus {limits['cpus']} (a 2-core host must start it)"
        assert re.fullmatch(r"\d+[mg]", str(limits["memory"])), f"{name}: memory {limits['memory']!r}"


def test_the_gateway_runs_no_job_process_itself():
    services = compose()["services"]
    gw = " ".join(services["gateway"]["command"])
    assert "--launcher deployment" in gw and "--deployment-config /etc/meshrl/deployment.yaml" in gw
    assert "--max-running-jobs 1" in gw
    for name in WORKER_SERVICES:
        assert "meshrl worker --role " + name in " ".join(services[name]["command"]), name
    for c in k8s_containers():
        cmd = " ".join(c.get("command", []))
        if c["name"] == "gateway":
            assert "--launcher deployment" in cmd and "--deployment-config /etc/meshrl/deployment.yaml" in cmd
        elif c["name"] in WORKER_SERVICES:
            assert cmd.startswith("meshrl worker --role " + c["name"]), cmd
    assert "--ends-job" in " ".join(services["trainer"]["command"])


def _merge(base: dict, over: dict) -> dict:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


def test_the_deployment_wiring_agrees_with_the_example_job_and_the_ports():
    """job.yaml (the example job) merged with the wiring keeps every port: the compose/k8s
    port checks above hold for every job the gateway hands out."""
    cm = next(d for d in k8s_docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "meshrl-job")
    pairs = [((ROOT / "deploy" / "config" / "job.yaml").read_text(),
              (ROOT / "deploy" / "config" / "deployment.yaml").read_text()),
             (cm["data"]["job.yaml"], cm["data"]["deployment.yaml"])]
    for job_text, wiring_text in pairs:
        job_raw, wiring = yaml.safe_load(job_text), yaml.safe_load(wiring_text.replace("{job_id}", "j1"))
        merged = parse_job(_merge(yaml.safe_load(job_text), wiring))
        job = parse_job(job_raw)
        for block, fields in wiring.items():
            for field in fields:
                if field.endswith("_dir"):
                    continue
                assert getattr(getattr(merged, block), field) == getattr(getattr(job, block), field), (block, field)
        assert merged.trainer.default_local_dir.endswith("/j1")


def test_gpu_variants_reserve_gpus_and_use_the_cuda_image():
    import jsonschema
    import kubernetes_validate
    from check_jsonschema.builtin_schemas import vendor

    schema = json.loads((Path(vendor.__file__).parent / "compose-spec.json").read_text())
    gpu = yaml.safe_load((ROOT / "docker-compose.gpu.yml").read_text())
    jsonschema.validate(gpu, schema)
    for name in ("trainer", "rollout"):
        devices = gpu["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}], name
    for name, svc in gpu["services"].items():
        assert svc["image"] == "meshrl:cuda" and svc["build"]["target"] == "cuda", name
    assert set(gpu["services"]) == {n for n, s in compose()["services"].items() if s["image"].startswith("meshrl:")}
    # Kubernetes: apply the overlay's JSON patches to the base manifests and validate the result.
    overlay = yaml.safe_load((K8S / "gpu" / "kustomization.yaml").read_text())
    assert overlay["resources"] == [".."] and overlay["images"] == [{"name": "meshrl", "newTag": "cuda"}]
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_docs()}
    patched = set()
    for p in overlay["patches"]:
        doc = docs[(p["target"]["kind"], p["target"]["name"])]
        for op in yaml.safe_load(p["patch"]):
            assert op["op"] == "add"
            *parents, leaf = [s.replace("~1", "/").replace("~0", "~") for s in op["path"].strip("/").split("/")]
            node = doc
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
            node[leaf] = op["value"]
        kubernetes_validate.validate(doc, "1.30", strict=True)
        res = doc["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == "1"
        patched.add(p["target"]["name"])
    assert patched == {"meshrl-trainer", "meshrl-rollout"}
    stages = set(re.findall(r"^FROM \S+ AS (\w+)", DOCKERFILE.read_text(), flags=re.M))
    assert "cuda" in stages


def test_the_dockerfile_fails_loudly_and_takes_its_base_as_an_argument():
    text = DOCKERFILE.read_text()
    assert "|| true" not in text and "|| :" not in text
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in text and "FROM ${BASE_IMAGE} AS cpu" in text
    assert "set -eux" in text


def test_k8s_monitoring_scrapes_the_same_jobs_and_passes_promtool(tmp_path):
    cm = next(d for d in k8s_docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "meshrl-prometheus")
    cfg = cm["data"]["prometheus.yml"]
    (tmp_path / "token").write_text("x")
    (tmp_path / "alerts.yml").write_text((PROM / "alerts.yml").read_text())
    cfg = cfg.replace("/run/secrets/gateway/token", str(tmp_path / "token")).replace(
        "/etc/prometheus/rules/alerts.yml", "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(cfg)
    r = _promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    # the same jobs and ports as under compose, through Services that exist
    prom = yaml.safe_load(cm["data"]["prometheus.yml"])
    compose_prom = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert {sc["job_name"] for sc in prom["scrape_configs"]} == {sc["job_name"] for sc in compose_prom["scrape_configs"]}
    services = {d["metadata"]["name"]: d for d in k8s_docs() if d["kind"] == "Service"}
    for sc in prom["scrape_configs"]:
        for st in sc.get("static_configs", []):
            for t in st["targets"]:
                host, port = t.rsplit(":", 1)
                assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}, t
        for dns in sc.get("dns_sd_configs", []):
            for host in dns["names"]:
                assert services[host]["spec"].get("clusterIP") == "None", f"{host}: needs a headless Service"
                assert dns["port"] in {p["port"] for p in services[host]["spec"]["ports"]}
    # the init containers copy files the image really has
    src = DOCKERFILE.read_text()
    for d in k8s_docs():
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"].get("initContainers", []):
                for path in re.findall(r"/opt/meshrl/(\S+)", " ".join(c["command"])):
                    top = "/".join(path.split("/")[:2])
                    assert f"COPY {top}/" in src, path
                    assert list(ROOT.glob(path)), path


def test_vllm_and_the_trainer_get_a_large_enough_dev_shm():
    """vLLM refuses to start with the container runtimes' 64 MiB /dev/shm (seen under podman)."""
    services = compose()["services"]
    for name in ("rollout", "trainer"):
        assert services[name]["shm_size"] == "1g", name
    for d in k8s_docs():
        if d["kind"] == "Deployment" and d["metadata"]["name"] in ("meshrl-rollout", "meshrl-trainer"):
            spec = d["spec"]["template"]["spec"]
            shm = next(v for v in spec["volumes"] if v["name"] == "shm")
            assert shm["emptyDir"]["medium"] == "Memory"
            assert {"name": "shm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
