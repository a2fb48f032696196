"""Benchmark: the weight path end to end, from ``publish()`` to every replica serving the version.

For each model size (random-weight Qwen2-style models built here, nothing downloaded:
``10m`` ~ 10M parameters, ``100m`` ~ 100M, ``500m`` = Qwen2.5-0.5B's shapes, ~494M) and
each replica count (1, then 2 ``python -m rollout_svc`` processes with real vLLM engines),
each round measures, in the same run:

* e2e: the time from ``WeightPublisher.publish(v, tensors, borrow=True)`` (the trainer's
  path: fresh float32 tensors, as FSDP2's ``full_tensor()`` gives) until every replica has
  answered a ``Generate`` request with ``policy_version == v`` -- bucket packing, the gloo
  broadcast straight into each replica's vLLM worker, the checked in-place load, the
  scheduler's pause/resume and one served request;
* tcp: the same bytes sent with ``socket.sendall`` straight from the tensors to as many
  receiver processes over loopback TCP (one sender thread per receiver, concurrently),
  each receiving into a reused buffer and acknowledging.

After each round, every replica's own account of the update is printed (from its log):
``begin_to_load_s`` (BEGIN arrived in the worker -> the load started: the note, the
scheduler's pause, the load RPC), inside the load ``wait_s`` (blocked on the next bucket),
``check_s`` (names/shapes/finite values), ``reload_s`` (vLLM's weight loaders and per-layer
kernel processing), ``refresh_s`` (the CPU LM-head kernel), ``after_received_s`` (how long
the load ran on after the last bucket arrived), and around it ``pause_s``, ``load_rpc_s``,
``reset_s``, ``resume_s``, ``loaded_rpc_s``.

The first round (cold memory) is dropped and the median of the others counts. One line per
size, then ``weights_e2e ratio_vs_tcp=<R> seconds_per_gb=<S> peak_extra_mb=<M>``: R = tcp
seconds / e2e seconds at the largest size with the most replicas; S = e2e seconds per GiB
there; M = the growth of the resident memory of a replica's vLLM worker process (the one
holding the model, where the channel is received) during the first update at that size (``VmHWM`` after the update minus ``VmRSS`` before it, the high-water
mark reset first), i.e. what receiving and loading a version costs on top of the model.

``--model DIR`` measures an existing Hugging Face model directory instead of the built sizes.
``--lora-rank R`` (with ``--lora-alpha``, ``--target-modules``) measures, in the same run and on
the same model, full-weight versions and then LoRA adapter versions (the replicas started with
the job's LoRA keys), and ends on ``weights_e2e lora_rank=R full_bytes=... lora_bytes=...
bytes_ratio=... full_e2e_s=... lora_e2e_s=... latency_ratio=<full/lora>`` (bench/_lora_weights.py).

Memory: a 500m run holds the trainer's fp32 copy (2 GB) in this process and one model copy
per replica (plus its 1 GiB KV cache); ``--sizes 10m,100m`` keeps it small.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (hidden, intermediate, layers, heads, kv_heads, vocab); head_dim 64, tied embeddings
SIZES = {
    "10m": (256, 768, 6, 4, 2, 20480),
    "100m": (768, 2560, 10, 12, 2, 32768),
    "500m": (896, 4864, 24, 14, 2, 151936),  # Qwen2.5-0.5B
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10m,100m,500m", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--replicas", default=None, help="replica counts to measure, ascending (default 1,2; 1 with "
                   "--lora-rank)")
    p.add_argument("--rounds", type=int, default=4, help="rounds per setting; the first is dropped (default 4)")
    p.add_argument("--bucket-mb", type=float, default=64.0, help="weight channel bucket size in MiB")
    p.add_argument("--dtype", default="float32", help="the replicas' serving dtype (default float32)")
    p.add_argument("--timeout", type=float, default=600.0, help="deadline of every step in seconds")
    p.add_argument("--workdir", default="/tmp/meshrl-bench-weights-e2e", help="where models are built")
    p.add_argument("--model", default=None, help="an existing HF model directory instead of --sizes")
    p.add_argument("--lora-rank", type=int, default=0, help="> 0: also measure LoRA adapter versions of this rank")
    p.add_argument("--lora-alpha", type=float, default=32.0, help="LoRA alpha with --lora-rank (default 32)")
    p.add_argument("--target-modules", default="all-linear", help="LoRA targets: all-linear or a comma list")
    p.add_argument("--role", choices=["main", "tcp"], default="main", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------ models


def build_model(name: str, workdir: Path) -> Path:
    """A random-weight Qwen2 model directory (tokenizer from services.modelling.tiny)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from services.modelling.tiny import TinyModelSpec, build_tiny_model

    out = workdir / name
    if (out / "bench_done").exists():
        return out
    if out.exists():
        shutil.rmtree(out)
    hidden, inter, layers, heads, kv, vocab = SIZES[name]
    build_tiny_model(out, TinyModelSpec())  # tokenizer, chat template, generation config
    cfg = Qwen2Config.from_pretrained(out)
    cfg.update(dict(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                    num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=True, torch_dtype="float32",
                    layer_types=["full_attention"] * layers, max_window_layers=layers))
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(cfg)
    for f in out.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100GB")
    del model
    (out / "bench_done").write_text("ok")
    return out


def trainer_tensors(model_dir: Path):
    """The trainer's fp32 parameters (HF names), fresh tensors as FSDP2's full_tensor() gives."""
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    tensors.pop("lm_head.weight", None)  # tied
    return list(tensors.items())


# ------------------------------------------------------------------ replicas


class Replica:
    """``python -m rollout_svc`` in its own process group; its readiness line parsed."""

    def __init__(self, cfg_path: Path, name: str, timeout: float):
        from services.readiness import NotReady, OutputWatcher

        env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1",
                   PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-m", "rollout_svc", "--config", str(cfg_path), "--id", name],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
                                     start_new_session=True)
        self.output = OutputWatcher(self.proc)
        self.last_output: tuple[int, float] | None = None  # (first response token, its log-prob), last Generate
        self.lines = self.output.lines
        try:
            ready = self.output.wait(timeout)
        except NotReady as exc:
            self.kill()
            raise RuntimeError(f"replica {name} did not start: {exc}") from None
        self.port = ready.port("grpc")
        from services import auth
        from services.pb import rollout_pb2_grpc

        self.channel = auth.channel(f"127.0.0.1:{self.port}", auth.current())
        self.stub = rollout_pb2_grpc.RolloutServiceStub(self.channel)
        self.engine_pid = self._model_process()

    def _model_process(self) -> int | None:
        """The vLLM worker process that holds the model (on CPU vLLM runs its worker in a
        process of its own under the EngineCore): the replica's largest descendant."""
        best, best_rss = None, 0
        for pid in _descendants(self.proc.pid):
            try:
                rss = _mem(pid)["VmRSS"]
            except (OSError, KeyError):
                continue
            if rss > best_rss:
                best, best_rss = pid, rss
        return best

    def served_version(self, item_frame: bytes, timeout: float) -> int:
        """Send one request; the policy version it was generated with."""
        from services import wire
        from services.pb import rollout_pb2

        resp = self.stub.Generate(rollout_pb2.RolloutGenerateRequest(frame=item_frame), timeout=timeout)
        out = wire.decode(bytearray(resp.frame))
        self.last_output = (int(out.batch["responses"][0, 0]), float(out.batch["rollout_log_probs"][0, 0]))
        return int(out.batch["policy_version"][0])

    def load_timing(self, version: int, timeout: float) -> str | None:
        """The replica's log of where loading ``version`` spent its time (``timing k=s ...``),
        waiting up to ``timeout`` for it (it is logged after LOADED is reported)."""
        needle = f"now serves policy version {version} "
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in reversed(self.lines):
                if needle in line and " timing " in line:
                    return line.split(" timing ", 1)[1].strip()
            time.sleep(0.05)
        return None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in os.listdir(f"/proc/{p}/task") if os.path.isdir(f"/proc/{p}/task") else []:
            try:
                kids = [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _mem(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0]) << 10
    return out


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def request_frame(prompt: list[int]) -> bytes:
    import numpy as np

    from services import wire
    from services.protocol import DataProto

    ids = np.empty(1, dtype=object)
    ids[0] = prompt
    item = DataProto.from_dict(non_tensors={"raw_prompt_ids": ids, "uid": np.array(["bench"], dtype=object)},
                               meta_info={"validate": True, "n": 1})
    return bytes(wire.encode(item))


# ------------------------------------------------------------------ raw TCP baseline


def tcp_receiver(port: int) -> int:
    """Receive payloads (8-byte length, then bytes) into one reused buffer; ack each."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(64 << 20)
    view = memoryview(buf)
    while True:
        head = sock.recv(8, socket.MSG_WAITALL)
        if len(head) < 8:
            return 0
        (left,) = struct.unpack("<Q", head)
        while left:
            n = sock.recv_into(view[: min(left, len(buf))])
            if n == 0:
                return 1
            left -= n
        sock.sendall(b"A")


class TcpBaseline:
    def __init__(self, receivers: int, timeout: float):
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.srv.settimeout(timeout)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.procs = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--role", "tcp", "--port",
                                        str(self.srv.getsockname()[1])], env=env, cwd=ROOT) for _ in range(receivers)]
        self.conns = []
        for _ in self.procs:
            c, _ = self.srv.accept()
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.settimeout(timeout)
            self.conns.append(c)

    def send(self, views: list[memoryview]) -> float:
        total = sum(len(v) for v in views)

        def one(c: socket.socket) -> None:
            c.sendall(struct.pack("<Q", total))
            for v in views:
                c.sendall(v)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=one, args=(c,)) for c in self.conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in self.conns:
            if c.recv(1) != b"A":
                raise RuntimeError("a TCP receiver did not acknowledge")
        return time.perf_counter() - t0

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.srv.close()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


# ------------------------------------------------------------------ one size


def run_size(name: str, args: argparse.Namespace, counts: list[int], version0: int, model_dir: str | None = None,
             tensors: list | None = None, model_keys: dict | None = None, idle_requests: int = 0) -> dict:
    """One model (built ``name``, or ``model_dir``); ``tensors`` what each version publishes (default
    the model's own weights), ``model_keys`` more keys of the replicas' ``model:`` block;
    ``idle_requests`` Generates timed on the first replica before the rounds (no update going on)."""
    import torch
    import yaml

    from services.config.weights import WeightChannelConfig
    from trainer_svc.weights.publisher import WeightPublisher
    from services.weights.plan import DTYPES, wire_dtype_for

    model_dir = Path(model_dir) if model_dir else build_model(name, Path(args.workdir))
    tensors = trainer_tensors(model_dir) if tensors is None else tensors
    params = sum(t.numel() for _, t in tensors)
    pub = WeightPublisher(WeightChannelConfig(control_port=0, bucket_mb=args.bucket_mb,
                                              transfer_timeout_s=args.timeout)).start()
    port = int(pub.control_address.rsplit(":", 1)[1])
    spec = {
        "model": {"path": str(model_dir), "dtype": args.dtype, **(model_keys or {})},
        "rollout": {"prompt_length": 16, "response_length": 1, "max_num_seqs": 4, "max_model_len": 32,
                    "ignore_eos": True},
        "weights": WeightChannelConfig(control_port=port, bucket_mb=args.bucket_mb,
                                       transfer_timeout_s=args.timeout).model_dump(),
    }
    cfg_path = Path(args.workdir) / f"{name}-replica.yaml"
    cfg_path.write_text(yaml.safe_dump(spec))
    frame = request_frame([5, 6, 7, 8])
    replicas: list[Replica] = []
    result = {"name": name, "params": params, "runs": {}}
    version = version0
    try:
        for count in counts:
            while len(replicas) < count:
                replicas.append(Replica(cfg_path, f"bench-{name}-{len(replicas)}", args.timeout))
            if not pub.wait_for_replicas(count, timeout=args.timeout):
                raise RuntimeError(f"{count} replicas did not subscribe")
            missing = [r.proc.pid for r in replicas if r.engine_pid is None]
            if missing:
                raise RuntimeError(f"no vLLM worker process found under replica(s) {missing}")
            # what the channel moves: every replica announced args.dtype (weights.wire_dtype auto)
            wire = DTYPES[args.dtype]
            payload = [t.to(wire_dtype_for(t, wire)).contiguous() for _, t in tensors]
            views = [memoryview(t.view(-1).view(torch.uint8).numpy()) for t in payload]
            nbytes = sum(len(v) for v in views)
            tcp = TcpBaseline(count, args.timeout)
            e2e_s, tcp_s, peaks = [], [], []
            idle_s = []
            for _ in range(idle_requests):
                t0 = time.perf_counter()
                replicas[0].served_version(frame, args.timeout)
                idle_s.append(time.perf_counter() - t0)
            idle_out = replicas[0].last_output
            try:
                for rnd in range(args.rounds):
                    tcp_s.append(tcp.send(views))
                    version += 1
                    before = {}
                    for r in replicas:
                        if r.engine_pid:
                            _reset_peak(r.engine_pid)
                            before[r.engine_pid] = _mem(r.engine_pid)["VmRSS"]
                    report = {}
                    t0 = time.perf_counter()
                    th = threading.Thread(target=lambda v=version: report.update(
                        r=pub.publish(v, iter(tensors), borrow=True)), daemon=True)
                    th.start()
                    pending = list(replicas)
                    deadline = time.monotonic() + args.timeout
                    while pending:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"replicas did not serve v{version} within {args.timeout:g}s")
                        pending = [r for r in pending if r.served_version(frame, args.timeout) < version]
                    e2e_s.append(time.perf_counter() - t0)
                    th.join(args.timeout)
                    pub_s = report["r"].seconds
                    if report["r"].error:
                        raise RuntimeError(f"publish v{version} failed: {report['r'].error}")
                    peaks.append(max((_mem(pid)["VmHWM"] - rss for pid, rss in before.items()), default=0))
                    if os.environ.get("BENCH_DEBUG"):
                        print({pid: (rss >> 20, {k: v >> 20 for k, v in _mem(pid).items()}) for pid, rss in before.items()})
                    print(f"  {name} replicas={count} round {rnd}: e2e {e2e_s[-1]:.3f}s (publish() returned after "
                          f"{pub_s:.3f}s) tcp {tcp_s[-1]:.3f}s ({report['r'].num_buckets} buckets, peak extra "
                          f"{peaks[-1] / 2**20:.0f} MiB)", flush=True)
                    for i, r in enumerate(replicas):
                        t = r.load_timing(version, 10.0)
                        if t:
                            print(f"    replica {i} v{version}: {t}", flush=True)
                    pub.wait_for_snapshot(version, timeout=args.timeout)
            finally:
                tcp.close()
            warm = slice(1, None) if args.rounds > 1 else slice(None)
            med_e2e, med_tcp = statistics.median(e2e_s[warm]), statistics.median(tcp_s[warm])
            # the first update includes one-time costs (and glibc keeps freed memory for later
            # rounds), so it is the conservative figure; warm rounds show the reuse
            result["runs"][count] = {"e2e_s": med_e2e, "tcp_s": med_tcp, "bytes": nbytes, "peak_extra": peaks[0],
                                     "peak_extra_warm": max(peaks[warm]), "ratio": med_tcp / med_e2e,
                                     "served": [r.last_output for r in replicas],
                                     "idle_request_s": statistics.median(idle_s) if idle_s else None,
                                     "idle_output": idle_out}
    finally:
        for r in replicas:
            r.kill()
        pub.close()
        del tensors
    result["version"] = version
    return result


def model_name(model_dir: str) -> str:
    """A file-name-safe name for a model directory (its last two path parts)."""
    return "-".join(Path(model_dir).resolve().parts[-2:])


def size_line(head: str, res: dict) -> str:
    parts = []
    for count, r in res["runs"].items():
        gib = r["bytes"] / 2**30
        parts.append(f"replicas={count} e2e_s={r['e2e_s']:.3f} tcp_s={r['tcp_s']:.3f} ratio={r['ratio']:.3f} "
                     f"s_per_gib={r['e2e_s'] / gib:.3f} peak_extra_mb={r['peak_extra'] / 2**20:.0f} "
                     f"(warm {r['peak_extra_warm'] / 2**20:.0f})")
    return f"{head} params={res['params'] / 1e6:.1f}M gib={r['bytes'] / 2**30:.3f} " + " | ".join(parts)


def main() -> int:
    args = parse_args()
    if args.role == "tcp":
        return tcp_receiver(args.port)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.replicas = args.replicas or ("1" if args.lora_rank else "1,2")
    if args.lora_rank:
        from _lora_weights import run_lora

        return run_lora(args, sys.modules[__name__])
    sizes = [model_name(args.model)] if args.model else [s.strip() for s in args.sizes.split(",") if s.strip()]
    bad = [] if args.model else [s for s in sizes if s not in SIZES]
    if bad:
        print(f"--sizes: unknown {bad} (choose from {sorted(SIZES)})", file=sys.stderr)
        return 2
    counts = sorted(int(c) for c in args.replicas.split(","))
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    from services import auth

    auth.provision_temporary()  # this run is a job of its own: publisher and replicas share it
    print(f"weights_e2e: sizes {sizes}, replicas {counts}, {args.rounds} rounds (first dropped), "
          f"bucket {args.bucket_mb:g} MiB, serving {args.dtype}", flush=True)
    results, version = [], 0
    for name in sizes:
        res = run_size(name, args, counts, version, model_dir=args.model)
        version = res["version"]
        results.append(res)
        print(size_line(f"size={name}", res), flush=True)
    last = results[-1]["runs"][counts[-1]]
    print(f"weights_e2e ratio_vs_tcp={last['ratio']:.3f} seconds_per_gb={last['e2e_s'] / (last['bytes'] / 2**30):.3f} "
          f"peak_extra_mb={last['peak_extra'] / 2**20:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
