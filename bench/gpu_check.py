"""The trainer's GPU paths on one real GPU, in one go (scripts/gpu_check.sh runs it there).

Sections (``--only`` picks some; each prints its figures and ``PASS``/``FAIL`` lines):

* ``env``: the card, torch, CUDA, NCCL and transformers versions;
* ``parity``: ``tests/integration/trainer_step_job.py`` (one rank, two GRPO steps on one
  synthetic batch per step) on CPU float32, CUDA float32 and CUDA bf16 mixed precision, for
  the quick start's tiny model and a Qwen2.5-0.5B-shaped random model: the recomputed
  log-probs, losses and updated weights of each CUDA run against the CPU run's;
* ``train``: ``bench/train.py --device cuda`` on the 0.5B-shaped model (bf16 mixed and
  float32): meshrl's GRPO update against plain torch on the same GPU, tokens/s and MFU;
* ``gather``: the publisher's gather of the full parameters from the GPU into CPU buckets
  (``iter_buckets(iter_full_params(model))``, float32 and bf16 on the wire) against a raw
  device-to-host copy of the same bytes: GB/s and ratio;
* ``publish``: a ``WeightPublisher`` (gloo) in the GPU trainer's process publishes the
  0.5B-shaped model to a CPU receiver process, which checks every tensor's digest;
* ``pytest``: every ``gpu``-marked test that needs no vLLM.

    python bench/gpu_check.py --out DIR [--only parity,train]

Exit status 1 when any check failed. Nothing here needs vLLM or the network.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "integration" / "trainer_step_job.py"
SECTIONS = ("env", "pytest", "parity", "gather", "publish", "train")
#: Qwen2.5-0.5B's shape (its config.json), with random weights
QWEN05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
               num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
               tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1000000.0)
MIXED = {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}}
FAILED: list[str] = []
DEVICE = "cuda"  # --device cpu: the gather and publish sections' own logic, on a machine without a GPU


def check(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        FAILED.append(what)


def env_section() -> None:
    import torch
    import transformers

    print(f"card: {torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB), "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
          f"transformers {transformers.__version__}, python {sys.version.split()[0]}", flush=True)


def build_models(root: Path) -> dict[str, Path]:
    """The quick start's tiny model and the 0.5B-shaped random one (float32, safetensors)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from services.modelling.tiny import TinyModelSpec, build_tiny_model

    tiny = build_tiny_model(root / "tiny", TinyModelSpec(seed=0))
    big = root / "qwen2.5-0.5b-shaped"
    if not (big / "config.json").exists():
        cfg = Qwen2Config(**QWEN05B, initializer_range=0.02, use_sliding_window=False, dtype="float32")
        cfg.architectures = ["Qwen2ForCausalLM"]
        torch.manual_seed(0)
        with torch.device(DEVICE):
            model = Qwen2ForCausalLM(cfg)
        model.save_pretrained(big)
        del model
    return {"tiny": tiny, "qwen2.5-0.5b-shaped": big}


def run_step_job(work: Path, model: Path, device: str, fsdp: dict, groups: int, length: int) -> tuple:
    from safetensors.torch import load_file

    from trainer_svc.launch import spawn_ranks

    work.mkdir(parents=True, exist_ok=True)
    spec = {"model": {"path": str(model)}, "data": {"train_batch_size": groups}, "rollout": {"n": 2},
            "actor": {"ppo_mini_batch_size": groups, "ppo_micro_batch_size_per_gpu": 4, "optim": {"lr": 1e-4},
                      "fsdp_config": fsdp}}
    (work / "spec.json").write_text(json.dumps(spec))
    t0 = time.perf_counter()
    code = spawn_ranks([str(JOB), str(work / "spec.json"), str(work / "out"), "--steps", "2", "--device", device,
                        "--groups", str(groups), "--prompt-len", str(length), "--response-len", str(length)],
                       1, threads=0 if device == "cpu" else 1, timeout_s=240)
    secs = time.perf_counter() - t0
    if code != 0:
        return None, secs
    out = work / "out"
    return (json.loads((out / "result.json").read_text()), load_file(str(out / "params.safetensors")),
            load_file(str(out / "log_probs.safetensors"))), secs


def compare(name: str, ref: tuple, got: tuple, start: dict, *, lp_max: float, lp_mean: float, cos_min: float) -> None:
    import torch

    res_r, params_r, lp_r = ref
    res_g, params_g, lp_g = got
    for k in ("step0", "step1"):
        mask = lp_r[k] != 0
        d = (lp_g[k] - lp_r[k]).abs()[mask]
        check(float(d.max()) <= lp_max and float(d.mean()) <= lp_mean,
              f"{name} {k} log-probs: max |diff| {float(d.max()):.2e} (<= {lp_max:g}), "
              f"mean {float(d.mean()):.2e} (<= {lp_mean:g})")
    for sr, sg in zip(res_r["steps"], res_g["steps"]):
        rel = {key: abs(sg["metrics"][key] - sr["metrics"][key]) / max(abs(sr["metrics"][key]), 1e-8)
               for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy")}
        print(f"     {name} v{sg['version']}: " + ", ".join(
            f"{k.split('/')[1]} {sg['metrics'][k]:.6g} vs {sr['metrics'][k]:.6g} (rel {v:.1e})" for k, v in rel.items()))
    check(all(params_g[n].dtype == torch.float32 for n in start), f"{name}: parameters stay float32")
    dot = ng = nr = 0.0
    worst = 0.0
    for n in start:  # per tensor, in float64: one 0.5B-element vector loses the sums' precision
        g, r = (params_g[n] - start[n]).double(), (params_r[n] - start[n]).double()
        dot, ng, nr = dot + float((g * r).sum()), ng + float((g * g).sum()), nr + float((r * r).sum())
        worst = max(worst, float((g - r).abs().max()))
    cos = dot / max((ng * nr) ** 0.5, 1e-30)
    check(cos >= cos_min, f"{name}: update cosine vs CPU {cos:.5f} (>= {cos_min}), max |param diff| {worst:.2e}")


def parity_section(models: dict[str, Path], work: Path) -> None:
    from safetensors.torch import load_file

    for label, model in models.items():
        big = label != "tiny"
        groups, length = (4, 32) if big else (4, 8)
        start = {}
        for f in sorted(model.glob("*.safetensors")):
            start.update(load_file(str(f)))
        runs = {}
        for mode, device, fsdp in (("cpu-fp32", "cpu", {}), ("cuda-fp32", "cuda", {}), ("cuda-bf16", "cuda", MIXED)):
            runs[mode], secs = run_step_job(work / label / mode, model, device, fsdp, groups, length)
            check(runs[mode] is not None, f"{label} {mode}: two trainer steps ran ({secs:.1f}s incl. load)")
        if any(r is None for r in runs.values()):
            continue
        names = [n for n in runs["cpu-fp32"][1] if n in start]
        start = {n: start[n] for n in names}
        compare(f"{label} cuda-fp32 vs cpu-fp32", runs["cpu-fp32"], runs["cuda-fp32"], start,
                lp_max=2e-3 if big else 1e-4, lp_mean=1e-4 if big else 1e-5, cos_min=0.99)
        compare(f"{label} cuda-bf16 vs cpu-fp32", runs["cpu-fp32"], runs["cuda-bf16"], start,
                lp_max=1.0, lp_mean=0.1, cos_min=0.9)


def train_section(models: dict[str, Path]) -> None:
    model = str(models["qwen2.5-0.5b-shaped"])
    for extra in (["--mixed-precision"], []):
        cmd = [sys.executable, str(ROOT / "bench" / "train.py"), "--device", "cuda", "--model", model,
               "--groups", "16", "--n", "4", "--prompt", "256", "--response", "256", "--micro", "16", "--reps", "2",
               *extra]
        print("$ " + " ".join(cmd[1:]), flush=True)
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
        print(p.stdout[-2000:], p.stderr[-2000:] if p.returncode else "", flush=True)
        check(p.returncode == 0 and "ratio_vs_torch=" in p.stdout, f"bench/train.py --device cuda {' '.join(extra)}")


def _load(model: Path):
    from trainer_svc.fsdp import load_causal_lm

    return load_causal_lm(str(model), device=DEVICE)


def _sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def gather_section(models: dict[str, Path]) -> None:
    import torch

    from services.weights import iter_buckets
    from trainer_svc.fsdp import iter_full_params

    model = _load(models["qwen2.5-0.5b-shaped"])
    nbytes = sum(t.numel() * t.element_size() for _, t in iter_full_params(model))
    cpu = torch.device("cpu")

    def raw() -> int:
        return sum(t.to(cpu).numel() for _, t in iter_full_params(model))

    def ours(wire) -> int:
        return sum(b.nbytes for b in iter_buckets(iter_full_params(model), 64 << 20, cpu, zero_copy_min_bytes=1 << 20,
                                                  wire_dtype=wire))

    for label, fn in (("raw .to(cpu)", raw), ("buckets fp32", lambda: ours(None)),
                      ("buckets bf16 wire", lambda: ours(torch.bfloat16))):
        fn()  # warm
        times = []
        for _ in range(5):
            _sync()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best = min(times)
        print(f"gather {label}: best {best:.3f}s median {statistics.median(times):.3f}s = {nbytes / best / 1e9:.2f} GB/s "
              f"of float32 parameters ({nbytes / 1e9:.2f} GB)", flush=True)
        if label.startswith("raw"):
            raw_best = best
        else:
            print(f"gather {label} ratio_vs_raw_d2h={raw_best / best:.3f}", flush=True)
    del model


def receiver(address: str, out: str, timeout: float) -> int:
    """One CPU replica's receiving side: load a version, report it, write each tensor's digest."""
    import torch

    torch.set_num_threads(4)
    from services.config.weights import WeightChannelConfig
    from rollout_svc.weights.receiver import WeightReceiver
    from services.weights.plan import iter_tensors

    rx = WeightReceiver(WeightChannelConfig(transfer_timeout_s=timeout), "cpu-replica", address=address).connect()
    try:
        update = None
        deadline = time.monotonic() + timeout
        while update is None and time.monotonic() < deadline:
            update = rx.wait_for_update(timeout=timeout)
        if update is None:
            return 2
        digests = {n: _digest(t) for n, t in iter_tensors(update.buckets())}
        rx.report_loaded(update.version)
        Path(out).write_text(json.dumps({"version": update.version, "digests": digests}))
        time.sleep(2)  # let the publisher see the report before the subscription closes
    finally:
        rx.close()
    return 0


def _digest(t) -> str:
    import torch

    return hashlib.sha256(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def publish_section(models: dict[str, Path], work: Path) -> None:
    import torch

    from services import auth
    from services.config.weights import WeightChannelConfig
    from trainer_svc.weights.publisher import WeightPublisher
    from trainer_svc.fsdp import iter_full_params

    auth.provision_temporary()
    model = _load(models["qwen2.5-0.5b-shaped"])
    pub = WeightPublisher(WeightChannelConfig(control_port=0, backend="gloo", transfer_timeout_s=120.0)).start()
    out = work / "received.json"
    proc = subprocess.Popen([sys.executable, __file__, "--role", "receiver", "--address", pub.control_address,
                             "--out", str(out)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        check(pub.wait_for_replicas(1, timeout=120), "the CPU replica subscribed to the GPU trainer's channel")
        check(pub.device.type == "cpu", f"a gloo channel packs on the CPU ({pub.device})")
        t0 = time.perf_counter()
        report = pub.publish(1, iter_full_params(model), borrow=True)
        loaded = pub.wait_for_replicas(1, timeout=120, served_version=1)
        secs = time.perf_counter() - t0
        check(report.error is None and loaded, f"published v1 from {DEVICE} over gloo, loaded by the CPU replica "
                                               f"({report.tensor_bytes / 1e9:.2f} GB in {secs:.2f}s = "
                                               f"{report.tensor_bytes / secs / 1e9:.2f} GB/s, {report.num_buckets} buckets)")
        check(proc.wait(timeout=120) == 0, "the CPU replica exited cleanly")
        got = json.loads(out.read_text())["digests"]
        want = {n: _digest(t) for n, t in iter_full_params(model)}
        same = sum(got.get(n) == d for n, d in want.items())
        check(same == len(want), f"the replica's tensors equal the GPU trainer's: {same}/{len(want)} digests")
    finally:
        if proc.poll() is None:
            proc.kill()
        pub.close()
        del model


def pytest_section() -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu and not vllm", "-p", "no:cacheprovider",
           "tests/integration/test_trainer_gpu.py", "tests/integration/test_weights_gpu.py", "-o", "addopts=-ra"]
    print("$ " + " ".join(cmd[1:]), flush=True)
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    print(p.stdout[-4000:], p.stderr[-2000:], flush=True)
    check(p.returncode == 0, "pytest -m 'gpu and not vllm'")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/meshrl-gpu-check")
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--role", choices=("main", "receiver"), default="main", help=argparse.SUPPRESS)
    ap.add_argument("--address", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "receiver":
        from services import auth

        auth.provision_temporary()
        return receiver(args.address, args.out, 120.0)
    global DEVICE
    DEVICE = args.device
    only = args.only.split(",")
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    models = build_models(work / "models") if set(only) - {"env", "pytest"} else {}
    for name, run in (("env", env_section), ("pytest", pytest_section), ("parity", lambda: parity_section(models, work)),
                      ("train", lambda: train_section(models)), ("gather", lambda: gather_section(models)),
                      ("publish", lambda: publish_section(models, work))):
        if name not in only:
            continue
        print(f"== {name} ({time.perf_counter() - t0:.0f}s)", flush=True)
        try:
            run()
        except Exception as e:  # a section that breaks is a failed check; the others still run
            check(False, f"{name}: {type(e).__name__}: {e}")
    print(f"gpu_check failed={len(FAILED)} seconds={time.perf_counter() - t0:.0f}", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
