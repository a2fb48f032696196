"""A trainer-rank program for tests: one training step on a fixed synthetic batch.

Run as ``nproc`` ranks by ``trainer_svc.launch.spawn_ranks``::

    python tests/integration/trainer_step_job.py SPEC.json OUT_DIR [--steps K]

Rank 0 writes ``OUT_DIR/result.json`` (per-step metrics, versions),
``OUT_DIR/params.safetensors`` (the full parameters after the last step) and
``OUT_DIR/log_probs.safetensors`` (each step's recomputed old log-probs, ``step<k>``); with
``--save DIR`` also a trainer checkpoint of the last step under DIR. ``--device cuda`` runs
the ranks on GPUs (nccl), the same code as on CPU (gloo).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    from trainer_svc.launch import die_with_launcher

    die_with_launcher()
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--prompt-len", type=int, default=7)
    ap.add_argument("--response-len", type=int, default=6)
    ap.add_argument("--nan-step", type=int, default=-1, help="poison the advantages of this step with NaN")
    ap.add_argument("--save", default=None, help="write a trainer checkpoint (DCP) of the last step here")
    ap.add_argument("--reuse-check", action="store_true",
                    help="only check which rows' old log-probs are recomputed (actor.recompute_old_log_prob)")
    ap.add_argument("--canary-check", action="store_true",
                    help="only check when a judging batch's verdict is handed over (before the updates)")
    ap.add_argument("--lag0-check", action="store_true",
                    help="only check that a candidate is judged with its own weights after the trainer stepped past it")
    args = ap.parse_args()

    import torch
    from safetensors.torch import save_file

    from services.config.views import TrainerView
    from trainer_svc.fsdp import init_distributed
    from trainer_svc.synthetic import make_batch
    from trainer_svc.worker import TrainerWorker

    torch.set_num_threads(1)
    spec = TrainerView.model_validate(json.loads(Path(args.spec).read_text()))
    ctx = init_distributed(args.device, timeout_s=120)
    worker = TrainerWorker(spec, ctx)
    vocab = worker.model.config.vocab_size
    if args.reuse_check:
        return reuse_check(worker, ctx, spec, vocab, Path(args.out))
    if args.canary_check:
        return canary_check(worker, ctx, spec, vocab, Path(args.out))
    if args.lag0_check:
        return lag0_check(worker, ctx, spec, vocab, Path(args.out))
    steps, log_probs = [], {}
    for step in range(args.steps):
        batch = make_batch(args.groups, n=spec.rollout.n, prompt_len=args.prompt_len, response_len=args.response_len,
                           vocab_size=vocab, seed=step)
        if step == args.nan_step:
            batch.batch["token_level_scores"][0, 0] = float("nan")
        res = worker.step(batch)
        log_probs[f"step{step}"] = batch.batch["old_log_probs"].float().cpu().contiguous()
        steps.append({"version": res.version, "applied": res.applied, "skipped": res.skipped_steps, "metrics": res.metrics})
    if args.save:
        from trainer_svc.checkpoint import CheckpointManager

        CheckpointManager(args.save, ctx).save(args.steps, worker, {})
    params = {name: t.cpu().clone().contiguous() for name, t in worker.full_params()}
    if ctx.rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        save_file(params, str(out / "params.safetensors"))
        save_file(log_probs, str(out / "log_probs.safetensors"))
        (out / "result.json").write_text(json.dumps({"steps": steps, "world": ctx.world_size}))
    import torch.distributed as dist

    dist.barrier()  # every rank past its last collective before any tears the group down
    dist.destroy_process_group()
    return 0


def reuse_check(worker, ctx, spec, vocab: int, out: Path) -> int:
    """The trainer's own log-probs of a batch, then the same batch with replica log-probs
    offset by 0.5 and every other row a version old: which rows did ``_old_log_probs`` recompute?"""
    import torch
    import torch.distributed as dist

    from trainer_svc.batching import ShardPlan
    from trainer_svc.synthetic import make_batch

    batch = make_batch(4, n=spec.rollout.n, prompt_len=7, response_len=6, vocab_size=vocab, seed=0)
    batch.meta_info["temperature"] = 1.0
    plan = ShardPlan.build(batch, ctx.world_size)
    own = plan.gather(worker.actor.compute_log_prob(plan.local(batch, ctx.rank))[0], ctx.cpu_group)
    stale = torch.arange(len(batch)) % 2 == 1
    batch.batch["policy_version"] = torch.where(stale, worker.version - 1, worker.version).long()
    batch.batch["rollout_log_probs"] = own + 0.5
    metrics = worker._old_log_probs(batch, plan, plan.local(batch, ctx.rank))
    mask = batch.batch["response_mask"].bool()
    got = batch.batch["old_log_probs"]
    res = {"metrics": metrics,
           "fresh_max_diff_from_replica": float((got - own - 0.5)[~stale][mask[~stale]].abs().max()),
           "stale_max_diff_from_trainer": float((got - own)[stale][mask[stale]].abs().max())}
    if ctx.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps(res))
    dist.barrier()  # every rank past its last collective before any tears the group down
    dist.destroy_process_group()
    return 0


def canary_check(worker, ctx, spec, vocab: int, out: Path) -> int:
    """A batch that judges candidate v0 (rows of v0, replica log-probs near the trainer's):
    rank 0 records, when its ``on_verdict`` is called, whether the parameters were still
    the step's starting ones; every rank gathers the full parameters in ``after_verdict``
    (the trainer's within-step offer of them) and reports the step's verdict."""
    import torch
    import torch.distributed as dist

    from trainer_svc.promotion import canary
    from trainer_svc.synthetic import make_batch

    batch = make_batch(4, n=spec.rollout.n, prompt_len=7, response_len=6, vocab_size=vocab, seed=0)
    batch.batch["rollout_log_probs"] = torch.zeros_like(batch.batch["response_mask"], dtype=torch.float32)
    batch.meta_info[canary.META_KEY] = {"version": 0, "max_logprob_gap_increase": 1e9, "promoted_logprob_gap": 0.0}
    def shards():  # this rank's shards (comparing DTensors would be a collective, and rank 0 alone checks)
        return {name: getattr(t, "to_local", lambda t=t: t)().detach() for name, t in worker.model.named_parameters()}

    def full_checksum():  # every rank: gathers the full parameters (a collective, as the trainer's publish)
        return sum(float(t.double().sum()) for _, t in worker.full_params())

    before = {name: t.clone() for name, t in shards().items()}
    start_checksum = full_checksum()
    calls, gathered = [], []

    def on_verdict(verdict, removed):
        unchanged = all(torch.equal(t, before[name]) for name, t in shards().items())
        calls.append({"verdict": verdict["promoted"], "params_unchanged": unchanged, "version": worker.version,
                      "removed": int(removed.sum())})

    def after_verdict(verdict):  # every rank, as the trainer offers the step's starting weights
        gathered.append({"verdict": verdict["promoted"], "version": worker.version,
                         "starting_weights": full_checksum() == start_checksum})

    res = worker.step(batch, on_verdict=on_verdict if ctx.rank == 0 else None, after_verdict=after_verdict)
    changed = any(not torch.equal(t, before[name]) for name, t in shards().items())
    report = {"calls": calls, "gathered": gathered, "result_promoted": res.canary["promoted"],
              "applied": res.applied, "version": res.version, "params_changed_after": changed,
              "full_changed_after": full_checksum() != start_checksum}
    if ctx.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps(report))
    dist.barrier()  # every rank past its last collective before any tears the group down
    dist.destroy_process_group()
    return 0


def lag0_check(worker, ctx, spec, vocab: int, out: Path) -> int:
    """The canary gate's judging with the candidate's own weights: v0 is offered (every rank
    keeps its shards), the trainer steps to v1, then a batch of v0's samples -- whose replica
    log-probs are v0's own, as a faithful canary serves them -- is judged twice: with the kept
    copy (gap ~0 at lag 0) and, the copy dropped, with v1's weights (the gap one step made).
    Also: the swap leaves the model's own v1 parameters and the copy's v0 ones as they were."""
    import torch
    import torch.distributed as dist

    from trainer_svc.promotion import canary
    from trainer_svc.batching import ShardPlan
    from trainer_svc.synthetic import make_batch

    def judging_batch():
        b = make_batch(4, n=spec.rollout.n, prompt_len=7, response_len=6, vocab_size=vocab, seed=7)
        b.meta_info["temperature"] = spec.rollout.temperature or 1.0
        return b

    def shards():
        return [getattr(t, "to_local", lambda t=t: t)().detach().cpu().clone() for t in worker.model.parameters()]

    own = judging_batch()  # v0's log-probs of it: what a canary serving v0 reports
    plan = ShardPlan.build(own, ctx.world_size)
    v0_lp = plan.gather(worker.actor.compute_log_prob(plan.local(own, ctx.rank))[0], ctx.cpu_group)
    worker.keep_offered()
    kept_v0 = [t.clone() for t in worker.offered.tensors]
    copy_on_host = all(t.device.type == "cpu" for t in worker.offered.tensors)
    for step in range(2):  # two steps past the candidate (lr 1e-3: the log-probs move)
        worker.step(make_batch(4, n=spec.rollout.n, prompt_len=7, response_len=6, vocab_size=vocab, seed=step))
    at_v2 = shards()
    spec_gate = {"version": 0, "max_logprob_gap_increase": 0.05, "promoted_logprob_gap": 0.0, "reference_gap": 0.0}
    report = {"version": worker.version, "copy_on_host": copy_on_host}
    for label in ("kept", "dropped"):
        b = judging_batch()
        b.batch["rollout_log_probs"] = v0_lp.clone()
        if label == "dropped":
            worker.offered = None
        p = ShardPlan.build(b, ctx.world_size)
        worker._old_log_probs(b, p, p.local(b, ctx.rank))
        judged = worker._candidate_log_probs(b, 0)
        verdict, _ = canary.judge(b, spec_gate, worker.version, 4, judged)
        report[label] = {"promoted": verdict["promoted"], "gap": verdict["measurements"]["logprob_gap"],
                         "lag": verdict["measurements"]["judged_lag"]}
        if label == "kept":
            report["model_restored"] = all(torch.equal(x, y) for x, y in zip(shards(), at_v2))
            report["copy_intact"] = all(torch.equal(x, y) for x, y in zip(worker.offered.tensors, kept_v0))
    if ctx.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps(report))
    dist.barrier()  # every rank past its last collective before any tears the group down
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
