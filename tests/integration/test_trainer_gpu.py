"""The trainer step on a CUDA GPU against the same step on CPU.

``tests/integration/trainer_step_job.py`` runs one rank two steps on the tiny model, on CPU
(gloo) and on CUDA (nccl), in float32 and with bf16 mixed precision: the same code, only the
device differs. Marked ``gpu``: deselected where CUDA is not usable (tests/fixtures/gpu.py),
run unchanged on a GPU machine (``pytest -m gpu``). No vLLM is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.distributed, pytest.mark.slow]

JOB = str(Path(__file__).with_name("trainer_step_job.py"))
MIXED = {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}}


def _spec(model: str, **actor) -> dict:
    base = {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "optim": {"lr": 1e-3}}
    base.update(actor)
    return {"model": {"path": model}, "data": {"train_batch_size": 4}, "rollout": {"n": 2}, "actor": base}


def _run(tmp: Path, spec: dict, device: str) -> tuple[dict, dict, dict]:
    from safetensors.torch import load_file

    from trainer_svc.launch import spawn_ranks

    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "spec.json").write_text(json.dumps(spec))
    code = spawn_ranks([JOB, str(tmp / "spec.json"), str(tmp / "out"), "--steps", "2", "--device", device], 1,
                       threads=1, timeout_s=500)
    assert code == 0, f"the {device} job failed with exit code {code}"
    out = tmp / "out"
    return (json.loads((out / "result.json").read_text()), load_file(str(out / "params.safetensors")),
            load_file(str(out / "log_probs.safetensors")))


@pytest.fixture(scope="module")
def cpu_fp32(tiny_model, tmp_path_factory):
    return _run(tmp_path_factory.mktemp("cpu"), _spec(tiny_model), "cpu")


def _update(params: dict, start: dict) -> torch.Tensor:
    return torch.cat([(params[n] - start[n]).flatten() for n in start])


def test_cuda_float32_step_matches_the_cpu_step(cpu_fp32, tiny_model, tmp_path):
    res_c, params_c, lp_c = cpu_fp32
    res_g, params_g, lp_g = _run(tmp_path, _spec(tiny_model), "cuda")
    for k in ("step0", "step1"):  # step1's recompute sees step0's update
        torch.testing.assert_close(lp_g[k], lp_c[k], atol=1e-4, rtol=1e-4, msg=f"{k} log-probs differ")
    for sc, sg in zip(res_c["steps"], res_g["steps"]):
        assert sg["version"] == sc["version"] and sg["applied"]
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert sg["metrics"][key] == pytest.approx(sc["metrics"][key], rel=1e-3, abs=1e-6), key
    for name in params_c:
        torch.testing.assert_close(params_g[name], params_c[name], atol=1e-4, rtol=1e-3, msg=f"parameter {name}")


def test_cuda_bf16_mixed_precision_step_tracks_the_cpu_float32_step(cpu_fp32, tiny_model, tmp_path):
    from trainer_svc.fsdp import load_causal_lm

    _, params_c, lp_c = cpu_fp32
    res_g, params_g, lp_g = _run(tmp_path, _spec(tiny_model, fsdp_config=MIXED), "cuda")
    assert [s["version"] for s in res_g["steps"]] == [1, 2]
    mask = lp_c["step0"] != 0
    gap = (lp_g["step0"] - lp_c["step0"]).abs()[mask]
    assert 0 < gap.mean() < 0.05, f"bf16 log-probs {gap.mean():.4f} from float32's on average"
    start = {n: p.detach() for n, p in load_causal_lm(tiny_model).named_parameters()}
    assert all(params_g[n].dtype == torch.float32 for n in start), "the master parameters must stay float32"
    cos = torch.nn.functional.cosine_similarity(_update(params_g, start), _update(params_c, start), dim=0)
    assert cos > 0.9, f"the bf16 update points elsewhere (cosine {cos:.3f})"


def test_a_candidate_is_judged_with_its_own_weights_kept_in_host_memory_on_cuda(tiny_model, tmp_path):
    """The canary gate's lag-0 judging on a GPU rank: the offered weights' shards are kept in
    host memory and swapped onto the device for the candidate's rows, then back."""
    from trainer_svc.launch import spawn_ranks

    (tmp_path / "spec.json").write_text(json.dumps(_spec(tiny_model)))
    code = spawn_ranks([JOB, str(tmp_path / "spec.json"), str(tmp_path / "out"), "--lag0-check", "--device", "cuda"],
                       1, threads=1, timeout_s=300)
    assert code == 0
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    assert res["copy_on_host"] and res["model_restored"] and res["copy_intact"]
    assert res["kept"]["lag"] == 0 and res["kept"]["gap"] < 1e-4 and res["kept"]["promoted"], res
    assert res["dropped"]["lag"] == 2 and not res["dropped"]["promoted"], res
