"""The KubeRay example (deploy/kuberay/), checked offline: the pod templates of its RayJob
against the Kubernetes 1.30 schemas (strict), the ConfigMap likewise, the job it mounts
against meshrl's job spec, and the two against each other -- every service's Ray resources
are offered by a worker group with the CPUs for it, the entrypoint is `meshrl run
--launcher ray` on the mounted spec, the image carries the Ray the cluster declares.
KubeRay's own CRD schema is not vendored here: the RayJob's fields are checked by name."""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from services.config.job import parse_job

ROOT = Path(__file__).resolve().parents[2]
KUBERAY = ROOT / "deploy" / "kuberay"

#: the RayJob / RayCluster fields this example uses (ray.io/v1)
RAYJOB_SPEC = {"entrypoint", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
               "rayClusterSpec", "submissionMode", "runtimeEnvYAML", "suspend"}
CLUSTER_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling"}
HEAD_SPEC = {"rayStartParams", "template", "serviceType"}
WORKER_SPEC = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template"}


def docs() -> dict[str, dict]:
    out = {}
    for p in sorted(KUBERAY.glob("*.yaml")):
        if p.name != "kustomization.yaml":
            for d in yaml.safe_load_all(p.read_text()):
                out[d["kind"]] = d
    return out


def _validate_template(template: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                  "template": template}, "1.30", strict=True)


def _groups(rayjob: dict) -> list[dict]:
    return rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]


def test_the_rayjob_is_well_formed_and_its_pods_match_the_kubernetes_schemas():
    import kubernetes_validate

    d = docs()
    rayjob, cm = d["RayJob"], d["ConfigMap"]
    kubernetes_validate.validate(cm, "1.30", strict=True)
    assert rayjob["apiVersion"] == "ray.io/v1"
    spec = rayjob["spec"]
    assert set(spec) <= RAYJOB_SPEC, set(spec) - RAYJOB_SPEC
    cluster = spec["rayClusterSpec"]
    assert set(cluster) <= CLUSTER_SPEC and set(cluster["headGroupSpec"]) <= HEAD_SPEC
    _validate_template(cluster["headGroupSpec"]["template"])
    names = [g["groupName"] for g in _groups(rayjob)]
    assert len(names) == len(set(names))
    for g in [cluster["headGroupSpec"], *_groups(rayjob)]:
        assert all(isinstance(v, str) for v in g["rayStartParams"].values()), g["rayStartParams"]  # map[string]string
    for g in _groups(rayjob):
        assert set(g) <= WORKER_SPEC, set(g) - WORKER_SPEC
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
        _validate_template(g["template"])
    listed = yaml.safe_load((KUBERAY / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in KUBERAY.glob("*.yaml") if p.name != "kustomization.yaml")


def test_the_template_check_can_fail():
    import kubernetes_validate

    template = copy.deepcopy(docs()["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"])
    template["spec"]["containers"][0]["ports"][0]["containerPort"] = "gcs"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_template(template)


def _ray_resources(group: dict) -> dict[str, float]:
    raw = group["rayStartParams"].get("resources", '"{}"')
    return json.loads(json.loads(raw))  # KubeRay passes the quoted JSON on to `ray start --resources`


def test_every_service_finds_a_worker_group_with_its_resources_and_cpus():
    d = docs()
    job = parse_job(yaml.safe_load(d["ConfigMap"]["data"]["job.yaml"]))
    assert job.services.launcher == "ray"
    rayjob = d["RayJob"]
    assert rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    from services.ray_launcher.placement import instance_names, request_of

    # place every instance's bundle on the groups' nodes, first fit (what Ray must manage too)
    free = [{"CPU": float(g["rayStartParams"]["num-cpus"]), **_ray_resources(g)}
            for g in _groups(rayjob) for _ in range(g["replicas"])]
    for name in instance_names(job):
        ask = request_of(job, name)
        node = next((n for n in free if all(n.get(k, 0) >= v for k, v in ask.items())), None)
        assert node is not None, f"{name} asks {ask}; the worker groups left {free}"
        for k, v in ask.items():
            node[k] -= v
    for g in _groups(rayjob):
        for c in g["template"]["spec"]["containers"]:
            assert float(c["resources"]["limits"]["cpu"]) >= float(g["rayStartParams"]["num-cpus"])


def test_the_entrypoint_runs_the_mounted_job_with_the_ray_launcher():
    d = docs()
    rayjob = d["RayJob"]
    argv = shlex.split(rayjob["spec"]["entrypoint"])
    assert argv[:2] == ["meshrl", "run"] and "--launcher" in argv and argv[argv.index("--launcher") + 1] == "ray"
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in head["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in head["volumes"]}
    spec_path = Path(argv[2])
    cm_mount = mounts[str(spec_path.parent)]
    assert volumes[cm_mount["name"]]["configMap"]["name"] == d["ConfigMap"]["metadata"]["name"]
    assert spec_path.name in d["ConfigMap"]["data"]
    job = yaml.safe_load(d["ConfigMap"]["data"][spec_path.name])
    run_dir = argv[argv.index("--run-dir") + 1]
    every_pod = [head, *(g["template"]["spec"] for g in _groups(rayjob))]
    for path in (job["model"]["path"], job["data"]["train_files"], run_dir):  # shared storage on every pod
        for pod in every_pod:
            assert any(path.startswith(m["mountPath"] + "/") for m in pod["containers"][0]["volumeMounts"]), (path, pod)
    # meshrl's own parser accepts the entrypoint as it is
    from meshrl_cli import build_parser
    from services.entrypoint import parse_with_overrides

    args = parse_with_overrides(build_parser(), argv[1:])
    assert args.launcher == "ray" and args.no_progress and "services.host=0.0.0.0" in args.overrides


def test_the_image_carries_the_ray_the_cluster_declares():
    import ray

    docker = (KUBERAY / "Dockerfile").read_text()
    version = docs()["RayJob"]["spec"]["rayClusterSpec"]["rayVersion"]
    assert re.search(r"^FROM meshrl:cpu$", docker, re.M)
    assert f'"ray[default,serve]=={version}"' in docker
    assert version == ray.__version__, "the example pins the Ray the tests run against"
    images = {c["image"] for t in [docs()["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"],
                                   *(g["template"] for g in _groups(docs()["RayJob"]))]
              for c in t["spec"]["containers"]}
    assert images == {"meshrl:cpu-ray"}
