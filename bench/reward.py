"""Benchmark: built-in GSM8K scoring through the reward service vs verl's in-driver loop.

Same run, same samples (``--samples`` responses of ~200 tokens, in groups of ``--group``,
verl's rollout layout: prompts, responses, response_mask, input_ids, attention_mask,
position_ids, rollout_log_probs; a locally trained byte-level BPE tokenizer):

* inline (the baseline, verl's ``NaiveRewardManager`` way): one process, a plain loop
  over samples -- valid length from the attention mask, ``decode`` of that sample, GSM8K
  ``compute_score``, write the score at the last valid token. Measured with the
  tokenizer verl uses (``transformers`` fast tokenizer) and with the raw ``tokenizers``
  one, best of two runs each; the FASTER is the baseline, so the ratio is conservative.
* service: a real ``redis-server`` (started here, on a free port) and ``--procs``
  processes of ``python -m reward_svc --config ...``; the groups are encoded into wire
  frames beforehand (that is the rollout side's work); once all services report ready,
  the clock starts and the bench puts every frame into ``rollouts`` (in chunks) while the
  services lease, decode (frames, then tokens), score, encode, put into ``experience``
  and ack.
  Timed until every group is in ``experience`` and ``rollouts`` is empty; then the bench
  reads ``experience`` back and checks every score against the expected one.

Last line: ``reward ratio_vs_inline=<R> samples_per_s=<S>`` with R = service samples/s
divided by inline samples/s, S = service samples/s.
"""

from __future__ import annotations

import argparse


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=100_000, help="samples to score (default 100000)")
    p.add_argument("--group", type=int, default=16, help="samples per group / queue item (default 16)")
    p.add_argument("--resp-len", type=int, default=256, help="padded response length (default 256)")
    p.add_argument("--prompt-len", type=int, default=64, help="padded prompt length (default 64)")
    p.add_argument("--procs", type=int, default=2, help="reward service processes (default 2)")
    p.add_argument("--get-batch", type=int, default=16, help="groups each service process leases per get")
    p.add_argument("--distinct", type=int, default=1000, help="distinct response texts (default 1000)")
    p.add_argument("--small", action="store_true", help="5000 samples: a quick smoke run")
    p.add_argument("--user-fn", action="store_true",
                   help="score with a user reward function file (the built-in scorer behind it), so every sample "
                   "goes through the sandbox (bubblewrap where it runs; docs/security.md)")
    return p.parse_args()


WORDS = (
    "the a of to and is what how many much total each sum product difference answer so there "
    "were has have had left more less apples books coins students friends minutes hours days "
    "pages dollars sold clips in April May half as altogether earns hour Let think step by "
    "step final equals plus minus times divided"
).split()


def make_texts(tok, n: int, rng) -> list[tuple[list[int], str]]:
    """``n`` GSM8K-style responses of ~200 tokens ending in ``#### <answer>``: (ids, answer)."""
    out = []
    for _ in range(n):
        answer = str(rng.randint(0, 100_000))
        parts: list[str] = []
        ids: list[int] = []
        while True:
            a, b = rng.randint(1, 999), rng.randint(1, 99)
            sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + f" {a} + {b} = {a + b}."
            cand = tok.encode(" ".join([*parts, sentence]) + f"\n#### {answer}").ids
            if len(cand) > 214 and parts:  # about 200 tokens on average
                break
            parts.append(sentence)
            ids = cand
        out.append((ids, answer))
    return out


def make_groups(tok_dir: str, n_samples: int, group: int, resp_len: int, prompt_len: int, distinct: int):
    """The benchmark's groups (DataProto, verl layout) and the expected score of each sample."""
    import random

    import numpy as np
    import torch
    from tokenizers import Tokenizer

    from services.protocol import DataProto

    rng = random.Random(0)
    tok = Tokenizer.from_file(f"{tok_dir}/tokenizer.json")
    eos, pad = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    texts = make_texts(tok, distinct, rng)
    groups, expected = [], []
    for g0 in range(0, n_samples, group):
        b = min(group, n_samples - g0)
        responses = torch.full((b, resp_len), pad, dtype=torch.int64)
        attn = torch.zeros((b, prompt_len + resp_len), dtype=torch.int64)
        attn[:, prompt_len - 24 : prompt_len] = 1
        truths = []
        for i in range(b):
            ids, answer = texts[rng.randrange(len(texts))]
            ids = ids + [eos]
            responses[i, : len(ids)] = torch.tensor(ids)
            attn[i, prompt_len : prompt_len + len(ids)] = 1
            right = rng.random() < 0.5
            truths.append(answer if right else str(int(answer) + 1))
            expected.append(1.0 if right else 0.0)
        prompts = torch.randint(0, 400, (b, prompt_len))
        uid = f"p{g0 // group:07d}"
        groups.append(
            DataProto.from_dict(
                tensors={
                    "prompts": prompts,
                    "responses": responses,
                    "response_mask": attn[:, prompt_len:].clone(),
                    "input_ids": torch.cat([prompts, responses], 1),
                    "attention_mask": attn,
                    "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
                    "rollout_log_probs": torch.randn(b, resp_len),
                    "policy_version": torch.zeros(b, dtype=torch.int64),
                },
                non_tensors={
                    "data_source": np.array(["openai/gsm8k"] * b, dtype=object),
                    "reward_model": np.array([{"style": "rule", "ground_truth": t} for t in truths], dtype=object),
                    "extra_info": np.array([{"index": g0 + i} for i in range(b)], dtype=object),
                    "uid": np.array([uid] * b, dtype=object),
                    "sample_id": np.array([f"{uid}/{i}" for i in range(b)], dtype=object),
                    "error": np.array([""] * b, dtype=object),
                },
            )
        )
    return groups, expected


def inline_score(groups, decode_one) -> tuple[float, list[float]]:
    """verl's in-driver loop over every sample; returns (seconds, scores)."""
    import time

    import torch

    from reward_svc.scorers import default_compute_score

    scores = []
    t0 = time.perf_counter()
    for data in groups:
        prompt_len = data.batch["prompts"].shape[-1]
        reward = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        for i in range(len(data)):
            item = data[i]
            valid_len = int(item.batch["attention_mask"][prompt_len:].sum())
            text = decode_one(item.batch["responses"][:valid_len])
            score = default_compute_score(
                item.non_tensor_batch["data_source"], text, item.non_tensor_batch["reward_model"]["ground_truth"],
                item.non_tensor_batch["extra_info"],
            )
            reward[i, valid_len - 1] = score
            scores.append(score)
    return time.perf_counter() - t0, scores


#: Run a command so that it is SIGKILLed when this benchmark dies (PR_SET_PDEATHSIG survives
#: exec): a killed benchmark (e.g. by the OOM killer) leaves no redis-server or service behind.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); os.execvp(sys.argv[1], sys.argv[1:])"
)


def _child(cmd: list[str]) -> list[str]:
    import sys

    return [sys.executable, "-c", _DIE_WITH_PARENT, *cmd]


def start_redis(workdir) -> tuple[object, str]:
    """A private in-memory ``redis-server`` on a free port: ``(Popen, url)``."""
    import shutil
    import subprocess

    from services.net import free_port, wait_for_port

    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(_child([
        exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), "--save", "", "--appendonly", "no",
        "--protected-mode", "yes", "--logfile", str(workdir / "redis.log"),
        "--proto-max-bulk-len", "1gb", "--client-query-buffer-limit", "1gb",
    ]), stdout=subprocess.DEVNULL)
    wait_for_port("127.0.0.1", port, 30, proc)
    return proc, f"redis://127.0.0.1:{port}/0"


async def service_run(frames: list, tok_dir: str, work, args) -> tuple[float, list[float]]:
    """Pre-fill ``rollouts``, run the service processes, time until ``experience`` holds all."""
    import asyncio
    import os
    import subprocess
    import sys
    import time

    import yaml

    from services.config.queues import RedisQueueConfig
    from services.readiness import OutputWatcher
    from services.queues import make_queue
    redis, url = start_redis(work / "redis")
    procs: list[subprocess.Popen] = []
    # frames of whole groups (~200 KB) are stored beside the stream entries: Redis appends and
    # reads them several times faster than inside the stream (see docs/reward.md)
    qcfg = RedisQueueConfig(url=url, namespace="bench", max_depth=10_000_000, large_frame_bytes=16384)
    producer = make_queue(qcfg, stream="rollouts", group="reward", consumer="bench-producer")
    trainer = make_queue(qcfg, stream="experience", group="trainer", consumer="bench-trainer")
    want = len(frames)
    try:
        cfg = {
            "reward": {"tokenizer_path": tok_dir, "get_batch": args.get_batch, "get_timeout_s": 0.5},
            "resources": {"grpc_port": None},
            "queues": qcfg.model_dump(mode="json"),
        }
        if args.user_fn:
            fn = work / "user_reward.py"
            fn.write_text("from reward_svc.scorers import default_compute_score as compute_score\n")
            cfg["reward"]["custom_reward_function"] = {"path": str(fn), "name": "compute_score"}
        (work / "reward.yaml").write_text(yaml.safe_dump(cfg))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for k in range(args.procs):
            procs.append(subprocess.Popen(
                _child([sys.executable, "-m", "reward_svc", "--config", str(work / "reward.yaml"), "--id", f"bench-{k}",
                 "--log-level", "WARNING"]),
                stdout=subprocess.PIPE, text=True, env=env,
            ))
        for p in procs:  # all started and warmed up (imports done) before the clock starts
            await asyncio.to_thread(OutputWatcher(p).wait, 120)  # NotReady (with the output) if not
        t0 = time.perf_counter()
        while frames:  # queue in: the frames go into Redis while the services consume
            chunk, frames[:64] = frames[:64], []  # (and leave this process's memory)
            await producer.put_frames(chunk)
        del chunk
        t_put = time.perf_counter() - t0
        deadline = time.monotonic() + 1800
        while True:
            if await producer.depth() == 0 and await trainer.depth() >= want:
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a reward service process exited early")
            if time.monotonic() > deadline:
                raise TimeoutError("the service did not finish within 30 minutes")
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - t0
        print(f"service: all groups put after {t_put:.2f}s, all scored after {elapsed:.2f}s", flush=True)
        by_uid: dict[str, list[float]] = {}
        while len(by_uid) < want:
            items = await trainer.get(256, 5.0)
            if not items:
                raise RuntimeError(f"experience ran dry at {len(by_uid)} of {want} groups")
            for it in items:
                by_uid[it.data.non_tensor_batch["uid"][0]] = it.data.batch["token_level_scores"].sum(-1).tolist()
            await trainer.ack(items)
        scores = [s for uid in sorted(by_uid) for s in by_uid[uid]]
        return elapsed, scores
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        await producer.close()
        await trainer.close()
        redis.terminate()
        try:
            redis.wait(timeout=30)
        except subprocess.TimeoutExpired:
            redis.kill()


def main() -> None:
    args = parse_args()
    if args.small:
        args.samples = 5000
    import asyncio
    import tempfile
    from pathlib import Path

    import torch

    torch.set_num_threads(1)
    from services.modelling.tiny import TinyModelSpec, build_tokenizer

    with tempfile.TemporaryDirectory(prefix="meshrl-bench-reward-") as tmp:
        work = Path(tmp)
        tok_dir = work / "tok"
        tok_dir.mkdir()
        build_tokenizer(TinyModelSpec()).save(str(tok_dir / "tokenizer.json"))
        groups, expected = make_groups(str(tok_dir), args.samples, args.group, args.resp_len, args.prompt_len, args.distinct)
        n = len(expected)
        tokens = sum(int(g.batch["response_mask"].sum()) for g in groups)
        print(f"samples={n} groups={len(groups)} mean_response_tokens={tokens / n:.1f}", flush=True)

        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        raw = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        hf = PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
        t_hf, t_raw = float("inf"), float("inf")
        for _ in range(2):  # best of two: the baseline must not suffer from a noisy neighbour
            t, s_hf = inline_score(groups, lambda ids: hf.decode(ids, skip_special_tokens=True))
            t_hf = min(t_hf, t)
            t, s_raw = inline_score(groups, lambda ids: raw.decode(ids.tolist(), skip_special_tokens=True))
            t_raw = min(t_raw, t)
        assert s_hf == expected and s_raw == expected, "inline scores do not match the expected ones"
        print(f"inline transformers-decode samples_per_s={n / t_hf:.0f}", flush=True)
        print(f"inline tokenizers-decode samples_per_s={n / t_raw:.0f}", flush=True)
        inline_sps = n / min(t_hf, t_raw)

        from services import wire
        from services.queues import RawItem

        # the rollout side's work (encoding each group into a frame) is done before the clock
        # starts; the DataProtos are dropped to keep this process small (Redis holds a copy)
        frames = [RawItem(wire.encode(g), tuple(g.non_tensor_batch["sample_id"].tolist())) for g in groups]
        del groups
        t_svc, s_svc = asyncio.run(service_run(frames, str(tok_dir), work, args))
        svc_sps = n / t_svc
        wrong = sum(1 for a, b in zip(s_svc, expected, strict=True) if a != b)
        print(f"service procs={args.procs} seconds={t_svc:.2f} samples_per_s={svc_sps:.0f} wrong_scores={wrong}", flush=True)
        if wrong or len(s_svc) != n:
            raise SystemExit(f"service scores differ from the expected ones ({wrong} wrong, {len(s_svc)} of {n})")
        print(f"reward ratio_vs_inline={svc_sps / inline_sps:.2f} samples_per_s={svc_sps:.0f}")


if __name__ == "__main__":
    from services import auth

    auth.provision_temporary()  # this run is a job of its own: its servers and clients share one credential
    main()
