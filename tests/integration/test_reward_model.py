"""The optional reward-model scorer: a real (tiny, locally built) sequence-classification model."""

from __future__ import annotations

import pytest
import torch

from reward_svc.decode import load_decoder
from reward_svc.manager import RewardManager
from reward_svc.reward_model import RewardModelScorer
from services.config.reward import RewardConfig
from tests.unit.reward_common import last_valid_index, make_group

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def rm_dir(tiny_model, tmp_path_factory):
    """The tiny policy turned into a 1-label classifier (seeded head), saved with its tokenizer."""
    from transformers import AutoTokenizer, Qwen2ForSequenceClassification

    out = tmp_path_factory.mktemp("tiny_rm")
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification.from_pretrained(tiny_model, num_labels=1)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(out)
    return str(out)


def test_reward_model_scores_prompt_plus_response(rm_dir, tiny_model):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rm = RewardModelScorer(rm_dir, micro_batch_size=2)
    cfg = RewardConfig(reward_model={"enable": True, "path": rm_dir})
    manager = RewardManager(cfg, load_decoder(tiny_model), rm=rm)
    texts = ["The answer is 12.", "#### 7", "so 3 + 4 = 7 and more words here"]
    g = make_group(tiny_model, texts, ["1"] * 3, "anything/at-all")
    q = AutoTokenizer.from_pretrained(tiny_model)("What is 3+4?", add_special_tokens=False)["input_ids"][:2]
    g.batch["prompts"][:, -2:] = torch.tensor(q)  # the 2 attended prompt tokens: real text
    out, rep = manager.score(g)

    # the same texts scored directly with transformers, one at a time (no padding)
    tok = AutoTokenizer.from_pretrained(rm_dir)
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    dec = load_decoder(tiny_model)
    r = g.batch["responses"].shape[1]
    prompt_ids = [row[m.bool()].tolist() for row, m in zip(g.batch["prompts"], g.batch["attention_mask"][:, :-r], strict=True)]
    prompts = dec.decode_batch(prompt_ids)
    assert all(p.strip() for p in prompts)
    with torch.no_grad():
        want = [model(**tok(p + t, return_tensors="pt")).logits[0, 0].item() for p, t in zip(prompts, texts, strict=True)]
    assert rep.scores == pytest.approx(want, abs=1e-4)
    assert len(set(round(s, 4) for s in rep.scores)) == 3  # really depends on the text
    tls = out.batch["token_level_scores"]
    last = last_valid_index(g)
    assert [tls[i, last[i]].item() for i in range(3)] == pytest.approx(want, abs=1e-4)
    assert list(out.non_tensor_batch["error"]) == ["", "", ""]


def test_reward_model_config_needs_a_path():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="reward_model.path"):
        RewardConfig(reward_model={"enable": True})


async def test_service_loads_the_reward_model_before_ready(rm_dir, tiny_model):
    from reward_svc.server import RewardServer
    from services import wire

    from services.config.views import RewardProcess

    cfg = RewardConfig(reward_model={"enable": True, "path": rm_dir})
    server = await RewardServer(cfg, load_decoder(tiny_model), resources=RewardProcess(grpc_port=None, device="cpu")).start()
    assert str(next(server.manager.rm.model.parameters()).device) == "cpu"
    try:
        assert server.manager.rm is not None
        g = make_group(tiny_model, ["a", "b"], ["x", "y"])
        g.non_tensor_batch.pop("reward_model")  # not needed by a reward model
        g.non_tensor_batch.pop("data_source")
        frame, rep = server.score_frame(bytes(wire.encode(g)))
        out = wire.decode(bytearray(frame))
        assert out.batch["token_level_scores"].sum(-1).tolist() == pytest.approx(rep.scores)
        assert rep.error_kinds == [None, None]
    finally:
        await server.stop()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_reward_device_reaches_the_process(rm_dir, tiny_model, tmp_path):
    """services.reward.device goes through the reward view into the process that loads the
    reward model: cpu runs it on CPU, cuda on a machine without CUDA is refused naming the key."""
    import subprocess
    import sys

    import yaml

    from services.config.job import parse_job
    from services.config.views import derive_view
    from services.readiness import OutputWatcher

    job = {"name": "rm", "model": {"path": tiny_model}, "data": {"train_files": "x.parquet", "train_batch_size": 2},
           "actor": {"ppo_mini_batch_size": 2}, "rollout": {"n": 2}, "reward": {"reward_model": {"enable": True, "path": rm_dir}},
           "services": {"reward": {"grpc_port": None}}}
    for device in ("cpu", "cuda"):
        view = derive_view(parse_job(job, [f"services.reward.device={device}"]), "reward")
        path = tmp_path / f"reward-{device}.yaml"
        path.write_text(yaml.safe_dump(view.model_dump(mode="json", by_alias=True)))
        proc = subprocess.Popen([sys.executable, "-m", "reward_svc", "--config", str(path), "--no-queue"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = OutputWatcher(proc)
        try:
            if device == "cpu":
                ready = out.wait(240)
                assert ready.info["device"] == "cpu"
            else:
                assert proc.wait(240) == 2
                assert "services.reward.device" in out.text() and "no CUDA device" in out.text()
        finally:
            proc.terminate()
            proc.wait(30)
