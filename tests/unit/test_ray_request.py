"""What each service instance asks Ray for (services.<svc>.ray, services/ray_launcher/placement.py),
and the spec errors naming the key. No cluster needed."""

from __future__ import annotations

import pytest

from services.config.job import JobSpecError, parse_job
from services.ray_launcher.placement import labels_of, request_of, service_kind

BASE = {"name": "x", "model": {"path": "/m"}, "data": {"train_files": ["/a.parquet"], "train_batch_size": 4},
        "actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2}}


def test_bundles_follow_the_services_block():
    spec = parse_job(BASE, ["services.launcher=ray", "services.trainer.nproc=2", "services.trainer.device=cuda",
                            "services.rollout.ray.resources={rollout: 1}", "services.reward.cpus=0-2",
                            "services.rollout.ray.num_cpus=0.5"])
    assert spec.services.launcher == "ray" and spec.services.ray.strategy == "PACK"
    assert request_of(spec, "trainer") == {"CPU": 2.0, "GPU": 2.0}
    assert request_of(spec, "rollout-3") == {"CPU": 0.5, "rollout": 1.0}
    assert request_of(spec, "reward-0") == {"CPU": 3.0}
    assert service_kind("rollout-3") == "rollout"


def test_labels_are_ray_label_selectors_per_service():
    spec = parse_job(BASE, ["services.rollout.ray.labels={pool: gen, market: '!spot'}",
                            "services.trainer.ray.labels={example.com/zone: 'in(a, b)'}"])
    assert labels_of(spec, "rollout-1") == {"pool": "gen", "market": "!spot"}
    assert labels_of(spec, "trainer") == {"example.com/zone": "in(a, b)"}
    assert labels_of(spec, "reward-0") == {}
    assert request_of(spec, "rollout-1") == {"CPU": 1.0}  # labels are no resource


@pytest.mark.parametrize(("override", "key", "says"), [
    ("services.rollout.ray.resources={GPU: 1}", "services.rollout.ray.resources", "not a custom resource"),
    ("services.reward.ray.resources={x: 0}", "services.reward.ray.resources", "must be > 0"),
    ("services.trainer.ray.num_cpus=-1", "services.trainer.ray.num_cpus", ""),
    ("services.launcher=k8s", "services.launcher", "'local' or 'ray'"),
    ("services.ray.strategy=ANY", "services.ray.strategy", "PACK"),
    ("services.ray.placement_timeout_s=0", "services.ray.placement_timeout_s", ""),
    ("services.rollout.ray.labels={pool: 'a b'}", "services.rollout.ray.labels", "not a label selector"),
    ("services.rollout.ray.labels={pool: 'in()'}", "services.rollout.ray.labels", "not a label selector"),
    ("services.trainer.ray.labels={'-x': a}", "services.trainer.ray.labels", "not a label key"),
])
def test_a_bad_ray_key_is_refused_naming_it(override, key, says):
    with pytest.raises(JobSpecError) as err:
        parse_job(BASE, [override])
    assert f"{key}:" in str(err.value) and says in str(err.value), str(err.value)
