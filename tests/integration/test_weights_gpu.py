"""The weight path on a GPU: NCCL into a GPU vLLM worker, CUDA FSDP2 gathers into buckets,
bf16 on the wire. Marked ``gpu``: deselected where CUDA is not usable (tests/fixtures/gpu.py),
run unchanged on a GPU machine (``pytest -m gpu``).

The code under test is the CPU path's own: ``WeightPublisher`` with backend ``nccl`` packs
into device buffers, the replica's receiver runs inside the vLLM worker
(``rollout_svc.weight_stream``) and receives each bucket into the worker's GPU memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.timeout(900)]

DEADLINE_S = 300.0


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coro, timeout: float = DEADLINE_S):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)


@pytest.mark.vllm
@pytest.mark.parametrize("serve_dtype", ["bfloat16", "float32"])
def test_nccl_channel_into_a_gpu_vllm_worker(tiny_model: str, serve_dtype: str) -> None:
    """fp32 trainer weights reach a GPU replica over NCCL; with a bf16 replica they travel as
    bf16 (half the bytes) and the served weights equal the trainer's cast to bf16."""
    from safetensors.torch import load_file

    from rollout_svc.engine import RolloutEngine
    from rollout_svc.replica import Replica
    from rollout_svc.subscriber import run_weight_subscriber
    from services.config.rollout import RolloutConfig
    from services.config.weights import WeightChannelConfig
    from trainer_svc.weights.publisher import WeightPublisher

    pub = WeightPublisher(WeightChannelConfig(control_port=0, backend="nccl", transfer_timeout_s=60.0,
                                              bucket_mb=0.05)).start()  # tiny buckets: split tensors too
    assert pub.backend == "nccl" and pub.device.type == "cuda"
    cfg = RolloutConfig(prompt_length=16, response_length=8, gpu_memory_utilization=0.3, enforce_eager=True)
    engine = RolloutEngine(cfg, tiny_model, dtype=serve_dtype)
    el = _Loop()
    el.run(engine.start())
    replica = Replica(engine, cfg, name="gpu-replica")
    stop = asyncio.Event()
    wcfg = WeightChannelConfig(control_port=pub.control_port, transfer_timeout_s=60.0)
    sub = asyncio.run_coroutine_threadsafe(run_weight_subscriber(replica, wcfg, "gpu-replica", stop), el.loop)
    try:
        assert pub.wait_for_replicas(1, timeout=DEADLINE_S)
        trainer = {k: v.float().cuda() for k, v in load_file(f"{tiny_model}/model.safetensors").items()}
        g = torch.Generator(device="cuda").manual_seed(0)
        trainer["model.norm.weight"] = torch.randn(trainer["model.norm.weight"].shape, generator=g, device="cuda")
        report = pub.publish(engine.version + 1, iter(trainer.items()), borrow=True)
        assert report.error is None and report.delivered == ["gpu-replica"]
        fp32_bytes = sum(t.numel() * 4 for t in trainer.values())
        assert report.tensor_bytes == (fp32_bytes // 2 if serve_dtype == "bfloat16" else fp32_bytes)
        deadline = time.monotonic() + DEADLINE_S
        while engine.version != report.version:
            assert time.monotonic() < deadline, "replica did not load the version"
            time.sleep(0.1)
        want = trainer["model.norm.weight"].to(getattr(torch, serve_dtype))
        got = el.run(engine.param_digest("model.norm.weight"))
        assert got["dtype"] == serve_dtype and got["sha256"] == _digest(want)
    finally:
        stop.set()
        sub.result(timeout=120)
        engine.shutdown()
        pub.close()


def _fsdp_rank(rank: int, world: int, port: int, model_dir: str, out: dict) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from services.weights import iter_buckets
    from services.weights.plan import iter_tensors
    from trainer_svc.fsdp import iter_full_params

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
        reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        device = torch.device("cuda", torch.cuda.current_device())
        buckets = iter_buckets(iter_full_params(model), 4096, device, zero_copy_min_bytes=1024,
                               wire_dtype=torch.bfloat16)
        got = dict(iter_tensors(buckets))  # full_tensor() all-gathers, packed on the GPU
        if rank == 0:
            out["ok"] = all(torch.equal(got[k], reference[k].to(torch.bfloat16)) for k in got)
            out["names"] = sorted(got)
    finally:
        dist.destroy_process_group()


def test_cuda_fsdp2_full_tensor_gathers_into_buckets(tiny_model: str) -> None:
    """FSDP2 shards on CUDA, gathered with full_tensor() layer by layer, packed into GPU
    buckets (split and bf16-cast on the way), come back bitwise equal to the cast weights."""
    import torch.multiprocessing as mp

    from services.net import free_port

    world = max(1, min(2, torch.cuda.device_count()))
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_fsdp_rank, args=(world, free_port(), tiny_model, out), nprocs=world, join=True)
    assert out["ok"] and "model.embed_tokens.weight" in out["names"]
