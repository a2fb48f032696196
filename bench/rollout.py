"""Benchmark: the rollout service end to end vs calling vLLM's engine directly.

Same run, same machine, same prompts, same engine arguments, same sampling settings
(temperature 1, per-sample seeds, ``ignore_eos`` so both sides generate exactly the same
number of tokens):

(a) baseline: an ``AsyncLLM`` in this process; every sample submitted at once, timed from
    the first submit to the last output;
(b) service: ``python -m rollout_svc`` as a separate process reading the ``prompts`` stream
    of a private ``redis-server`` and writing ``rollouts``; timed from the first ``put`` of a
    prompt group to the last packed group read back from ``rollouts`` (queue in, queue out,
    wire encode/decode, packing included).

Both run side by side (the service idles while the baseline runs and vice versa): each
is warmed up, then the timed set runs ``--repeats`` times alternating which side goes first, so
both see the same background load; the medians are compared.

Settling: after its last step a vLLM worker keeps busy-polling its shared-memory queue for
about a second (vLLM's ``SpinCondition``), and on CPU both engines' workers are bound to the
same core, so whichever side ran second used to lose that second to the other's idle spin
(runs going second were ~12% slower, whichever side it was). Each timed run therefore starts
``--settle`` seconds after the previous one ended. Then a weight update is published over the weight channel (gloo) to the
running service, and its load time (stage + pause + in-place load + resume) is read back.

Last line: ``rollout ratio_vs_vllm=<R> tokens_per_s=<T> weight_load_s=<W>`` where R is the
service's tokens/s over the baseline's (target >= 0.9).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model dir (default: build the tiny model into a temp dir)")
    p.add_argument("--prompts", type=int, default=256, help="prompt groups in the timed set")
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--response-length", type=int, default=64, help="tokens generated per sample")
    p.add_argument("--repeats", type=int, default=6,
                   help="timed runs per side, alternating which goes first (even: each side first equally often)")
    p.add_argument("--settle", type=float, default=2.0,
                   help="seconds to wait before each timed run (see 'Settling' in the module docstring)")
    p.add_argument("--threads", type=int, default=2, help="OMP threads for vLLM")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_prompts(model: str, count: int, offset: int = 0) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    out = []
    for i in range(offset, offset + count):
        msg = [{"role": "user", "content": f"What is {i % 97} + {(i * 7) % 53}?"}]
        out.append(list(tok.apply_chat_template(msg, tokenize=True, add_generation_prompt=True, return_dict=False)))
    return out


def rollout_cfg(args):
    from services.config.rollout import RolloutConfig

    return RolloutConfig(
        n=args.n, temperature=1.0, seed=1, prompt_length=64, response_length=args.response_length,
        ignore_eos=True, max_num_seqs=256, max_groups_in_flight=256, kv_cache_space_gib=1,
    )


# ------------------------------------------------------------------------------------ baseline
async def _direct_once(llm, engine_helper, sampling, prompts, tag: str) -> tuple[int, float]:
    import asyncio

    async def one(ids, sid):
        params = engine_helper.sampling_params(sampling, engine_helper.sample_seed(sid))
        final = None
        async for out in llm.generate({"prompt_token_ids": ids}, params, request_id=f"{tag}-{sid}"):
            final = out
        return len(final.outputs[0].token_ids)

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(p, f"b{i}/{k}") for i, p in enumerate(prompts) for k in range(sampling.n)))
    return sum(counts), time.perf_counter() - t0


class Baseline:
    """vLLM's ``AsyncLLM`` driven directly, with the service's engine args and sampling."""

    def __init__(self, args, model: str) -> None:
        from rollout_svc.engine import RolloutEngine

        self.cfg = rollout_cfg(args)
        self.helper = RolloutEngine(self.cfg, model)  # only for identical engine args / sampling params
        self.llm = None

    def start(self) -> "Baseline":
        from vllm.v1.engine.async_llm import AsyncLLM

        self.llm = AsyncLLM.from_engine_args(self.helper.engine_args())
        return self

    async def run(self, prompts, tag: str) -> tuple[int, float]:
        return await _direct_once(self.llm, self.helper, self.cfg.sampling_for(False), prompts, tag)

    def close(self) -> None:
        import gc

        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
            gc.collect()  # let AsyncLLM.__del__ run now, not during interpreter teardown


# ------------------------------------------------------------------------------------ service
def _item(ids, uid, n):
    import numpy as np

    from services.protocol import DataProto

    col = np.empty(1, dtype=object)
    col[0] = ids
    return DataProto.from_dict(
        non_tensors={"raw_prompt_ids": col, "uid": np.array([uid], dtype=object),
                     "sample_id": np.array([uid], dtype=object)},
        meta_info={"n": n, "validate": False},
    )


async def _through_queue(feeder, sink, prompts, n, tag) -> tuple[int, float, int]:
    items = [_item(p, f"{tag}-{i}", n) for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    await feeder.put(items)
    tokens = errors = got = 0
    deadline = time.monotonic() + 600
    while got < len(items):
        if time.monotonic() > deadline:
            raise TimeoutError(f"service delivered {got}/{len(items)} groups in 600s")
        batch = await sink.get(max_items=256, timeout=1.0)
        for leased in batch:
            d = leased.data
            tokens += int(d.batch["response_mask"].sum())
            errors += sum(1 for e in d.non_tensor_batch["error"] if e)
            got += 1
        if batch:
            await sink.ack(batch)  # as a consumer does: one ack per read
    return tokens, time.perf_counter() - t0, errors


async def run_interleaved(args, model: str, warm, timed, workdir: Path):
    """Start both sides, warm both, then alternate timed runs: baseline, service, baseline, ...

    Alternating makes both see the same background load on a shared machine. Returns
    ``(baseline_runs, service_runs, weight_load_s)`` with runs as (tokens, seconds)."""
    import asyncio
    import subprocess

    import yaml

    from services.config.queues import parse_queue_config
    from services.config.weights import WeightChannelConfig
    from services.queues import make_queue
    from services.queues.redis_server import RedisServer
    from services.readiness import NotReady, OutputWatcher
    from trainer_svc.weights.publisher import WeightPublisher

    redis = RedisServer(workdir / "redis", aof=False).start()
    pub = WeightPublisher(WeightChannelConfig(host="127.0.0.1", control_port=0, transfer_timeout_s=60)).start()
    port = int(pub.control_address.rsplit(":", 1)[1])
    cfg = rollout_cfg(args)
    spec = {
        "model": {"path": model},
        "rollout": cfg.model_dump(),
        "queues": {"type": "redis", "url": redis.url},
        "weights": {"host": "127.0.0.1", "control_port": port, "transfer_timeout_s": 60},
    }
    (workdir / "svc.yaml").write_text(yaml.safe_dump(spec))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), VLLM_CPU_KVCACHE_SPACE="1")
    log = open(workdir / "service.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "rollout_svc", "--config", str(workdir / "svc.yaml"),
                             "--id", "bench-0"], stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                            start_new_session=True)
    qcfg = parse_queue_config({"type": "redis", "url": redis.url})
    feeder = make_queue(qcfg, stream="prompts", group="rollout", consumer="bench-feeder")
    sink = make_queue(qcfg, stream="rollouts", group="reward", consumer="bench-sink")
    try:
        try:
            ready = OutputWatcher(proc).wait(600)
        except NotReady as exc:
            raise RuntimeError(f"rollout service did not start ({exc}); see {workdir / 'service.log'}") from None
        await _through_queue(feeder, sink, warm, args.n, "warm")
        base = Baseline(args, model).start()
        b_runs, s_runs = [], []
        try:
            await base.run(warm, "warm")
            async def baseline_run(r):
                tok, secs = await base.run(timed, f"t{r}")
                print(f"baseline run {r}: {tok} tokens in {secs:.2f}s = {tok / secs:.0f} tokens/s", flush=True)
                b_runs.append((tok, secs))

            async def service_run(r):
                tok, secs, errs = await _through_queue(feeder, sink, timed, args.n, f"t{r}")
                if errs:
                    raise RuntimeError(f"{errs} samples came back with errors")
                print(f"service run {r}: {tok} tokens in {secs:.2f}s = {tok / secs:.0f} tokens/s", flush=True)
                s_runs.append((tok, secs))

            for r in range(args.repeats):  # ABBA order: neither side always goes first
                first, second = (baseline_run, service_run) if r % 2 == 0 else (service_run, baseline_run)
                for side in (first, second):
                    await asyncio.sleep(args.settle)  # let the other engine's worker stop spinning
                    await side(r)
        finally:
            base.close()
        # a weight update through the channel to the running service
        from safetensors.torch import load_file

        if not pub.wait_for_replicas(1, timeout=60):
            raise RuntimeError("the service never subscribed to the weight channel")
        weights = load_file(str(next(Path(model).glob("*.safetensors"))))
        report = pub.publish(1, iter(weights.items()))
        if report.error or not pub.wait_for_replicas(1, timeout=120, served_version=1):
            raise RuntimeError(f"weight update failed: {report.error}")
        import grpc

        from services.pb import rollout_pb2, rollout_pb2_grpc

        from services import auth

        with auth.channel(ready.address("grpc"), auth.current()) as ch:
            st = rollout_pb2_grpc.RolloutServiceStub(ch).Status(rollout_pb2.RolloutStatusRequest(), timeout=30)
        print(f"weight update: v{st.served_version} loaded in {st.last_weight_load_s:.3f}s "
              f"({report.tensor_bytes / 1e6:.1f} MB, transfer {report.seconds:.3f}s)", flush=True)
        return b_runs, s_runs, st.last_weight_load_s
    finally:
        await feeder.close()
        await sink.close()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                import signal

                os.killpg(proc.pid, signal.SIGKILL)  # the replica's group: vLLM's children too
                proc.wait(timeout=30)
        pub.close()
        redis.stop()
        log.close()


def relay(argv: list[str]) -> int:
    """Run the benchmark in a child process and print its result line last.

    vLLM leaves a shared-memory object to Python's resource tracker, which warns about it on
    stderr *after* the process exits; reading the child's output to EOF (the tracker holds
    the pipe too) lets the result line come after every such message.
    """
    import subprocess

    proc = subprocess.Popen([sys.executable, __file__, *argv, "--child"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    result = None
    for line in proc.stdout:
        if line.startswith("rollout ratio_vs_vllm="):
            result = line
        else:
            sys.stdout.write(line)
            sys.stdout.flush()
    rc = proc.wait()
    if result is None:
        print(f"benchmark failed (exit code {rc})", file=sys.stderr)
        return rc or 1
    sys.stdout.write(result)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not args.child:
        return relay(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import asyncio

    with tempfile.TemporaryDirectory(prefix="meshrl-bench-rollout-") as tmp:
        workdir = Path(tmp)
        model = args.model
        if model is None:
            from services.modelling.tiny import build_tiny_model

            model = str(build_tiny_model(workdir / "tiny"))
        warm = make_prompts(model, 32, offset=1000)
        timed = make_prompts(model, args.prompts)
        b_runs, s_runs, wl = asyncio.run(run_interleaved(args, model, warm, timed, workdir))
    if {t for t, _ in b_runs} != {t for t, _ in s_runs}:
        print(f"warning: token counts differ (baseline {b_runs}, service {s_runs})", flush=True)
    base_tps = statistics.median(t / s for t, s in b_runs)
    svc_tps = statistics.median(t / s for t, s in s_runs)
    print(f"median baseline vLLM AsyncLLM: {base_tps:.0f} tokens/s; median service end to end: {svc_tps:.0f} tokens/s")
    print(f"rollout ratio_vs_vllm={svc_tps / base_tps:.3f} tokens_per_s={svc_tps:.0f} weight_load_s={wl:.3f}")
    return 0


if __name__ == "__main__":
    from services import auth

    auth.provision_temporary()  # this run is a job of its own: its servers and clients share one credential
    sys.exit(main())
