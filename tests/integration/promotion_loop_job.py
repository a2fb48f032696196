"""A trainer-rank program for tests: ``TrainerService`` on synthetic batches with a promotion
policy that records every hook the loop calls (and otherwise behaves as ``AllAtOnce``).

    python tests/integration/promotion_loop_job.py SPEC.json OUT_DIR

Its first ``next_command`` answers a ``publish`` of the same weights under the next version
number (``again``), so the loop's handling of a policy's command shows too. Rank 0 writes
``OUT_DIR/result.json``: the hooks called, in order, and what the loop reported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    from trainer_svc.launch import die_with_launcher

    die_with_launcher()
    import torch
    import torch.distributed as dist

    from services.config.views import TrainerView
    from trainer_svc.fsdp import init_distributed
    from trainer_svc.intake import SyntheticIntake
    from trainer_svc.promotion import AllAtOnce
    from trainer_svc.train_loop import TrainerService
    from trainer_svc.worker import TrainerWorker

    torch.set_num_threads(1)
    spec = TrainerView.model_validate(json.loads(Path(sys.argv[1]).read_text()))
    out = Path(sys.argv[2])
    calls: list[str] = []

    class Recording(AllAtOnce):
        def next_command(self, version):
            calls.append(f"next_command v{version}")
            return {"cmd": "publish", "again": True} if version == 0 else super().next_command(version)

        def wait_resumed(self, version, heartbeat, should_stop):
            calls.append("wait_resumed")
            return super().wait_resumed(version, heartbeat, should_stop)

        def step_control(self, batch, version):
            calls.append("step_control")
            return super().step_control(batch, version)

        def judge(self, batch, worker):
            calls.append("judge")
            return super().judge(batch, worker)

        def after_step(self, result):
            calls.append(f"after_step v{result.version}")

        def status(self):
            return {"recorded": len(calls)}

        def report(self, result):
            return {"policy_saw": result.version}

    ctx = init_distributed("cpu", timeout_s=120)
    worker = TrainerWorker(spec, ctx)
    source = SyntheticIntake(train_batch_size=spec.data.train_batch_size, n=spec.rollout.n, prompt_len=5,
                             response_len=4, vocab_size=worker.model.config.vocab_size)
    policy = Recording(spec.async_.max_staleness)
    service = TrainerService(spec, ctx, worker, source=source, policy=policy)
    code = service.run()
    lines = [json.loads(x) for x in Path(spec.trainer.metrics_file).read_text().splitlines()]
    result = {"code": code, "calls": calls, "worker_policy_is_the_loops": worker.policy is policy,
              "status": service.status(), "versions": [x["version"] for x in lines],
              "policy_saw": [x.get("policy_saw") for x in lines]}
    if ctx.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps(result))
    dist.barrier()  # every rank past its last collective before any tears the group down
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
