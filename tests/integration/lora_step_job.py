"""A trainer-rank program for the LoRA tests: training steps of a LoRA actor on fixed
synthetic batches, run as ``nproc`` real gloo ranks by ``trainer_svc.launch.spawn_ranks``::

    python tests/integration/lora_step_job.py SPEC.json OUT_DIR [--steps K] [--first S]
                                              [--save DIR] [--load DIR]

Step ``k`` trains on the synthetic batch of seed ``k`` (``--first`` is the first ``k``), so a
run that loads a checkpoint of step 1 and trains step 2 sees what an uninterrupted run's
step 2 saw. Rank 0 writes ``OUT_DIR/result.json``: per-step metrics and versions; which
parameters changed (all names, full tensors gathered); the optimizer's parameter count and
the adapter's; the names and bytes of what the trainer publishes; and the reference
policy's log-probs of a batch (``ref``) next to the actor's (``actor``). It also writes
``OUT_DIR/adapter.safetensors``: the published tensors after the last step.
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
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--save", default=None)
    ap.add_argument("--load", default=None)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file

    from services.config.views import TrainerView
    from trainer_svc.batching import ShardPlan
    from trainer_svc.checkpoint import CheckpointManager
    from trainer_svc.fsdp import init_distributed, iter_full_params
    from trainer_svc.synthetic import make_batch
    from trainer_svc.worker import TrainerWorker

    torch.set_num_threads(1)
    spec = TrainerView.model_validate(json.loads(Path(args.spec).read_text()))
    ctx = init_distributed("cpu", timeout_s=120)
    worker = TrainerWorker(spec, ctx)
    vocab = worker.model.config.vocab_size
    ckpt_step = None
    if args.load:
        ckpt = CheckpointManager(args.load, ctx)
        ckpt_step = ckpt.latest_step()
        ckpt.load(ckpt_step, worker)

    def everything() -> dict:
        return {n: t.cpu().clone() for n, t in iter_full_params(worker.model)}

    before = everything()
    steps = []
    for k in range(args.first, args.first + args.steps):
        batch = make_batch(4, n=spec.rollout.n, prompt_len=7, response_len=6, vocab_size=vocab, seed=k)
        res = worker.step(batch)
        steps.append({"version": res.version, "applied": res.applied, "metrics": res.metrics})
    after = everything()
    changed = sorted(n for n in before if not torch.equal(before[n], after[n]))
    if args.save:
        CheckpointManager(args.save, ctx).save(args.first + args.steps, worker, {})

    opt_numel = sum(p.numel() for g in worker.optimizer.param_groups for p in g["params"])
    trainable = sum(p.numel() for p in worker.model.parameters() if p.requires_grad)
    published = {n: t.cpu().clone().contiguous() for n, t in worker.full_params()}

    # the reference policy (adapter off) and the actor on one batch
    probe = make_batch(4, n=spec.rollout.n, prompt_len=7, response_len=6, vocab_size=vocab, seed=99)
    probe.meta_info["temperature"] = 1.0
    plan = ShardPlan.build(probe, ctx.world_size)
    local = plan.local(probe, ctx.rank)
    ref_lp = plan.gather(worker.ref.compute_ref_log_prob(local), ctx.cpu_group) if worker.ref is not None else None
    actor_lp = plan.gather(worker.actor.compute_log_prob(local)[0], ctx.cpu_group)
    if ctx.rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        save_file(published, str(out / "adapter.safetensors"))
        mask = probe.batch["response_mask"].bool()
        probe_tensors = {"actor": actor_lp.contiguous(), "input_ids": probe.batch["input_ids"].contiguous(),
                         "attention_mask": probe.batch["attention_mask"].contiguous(),
                         "position_ids": probe.batch["position_ids"].contiguous(),
                         "responses": probe.batch["responses"].contiguous(), "mask": mask.contiguous()}
        if ref_lp is not None:
            probe_tensors["ref"] = ref_lp.contiguous()
        save_file(probe_tensors, str(out / "probe.safetensors"))
        (out / "result.json").write_text(json.dumps({
            "world": ctx.world_size, "resumed_from": ckpt_step, "steps": steps, "changed": changed,
            "param_names": sorted(before), "optimizer_numel": opt_numel, "trainable_numel": trainable,
            "total_numel": sum(t.numel() for t in before.values()),
            "published": sorted(published), "published_bytes": sum(t.numel() * t.element_size()
                                                                   for t in published.values()),
            "model_class": type(worker.model).__name__,
        }))
    dist.barrier()  # every rank past its last collective before any tears the group down
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
