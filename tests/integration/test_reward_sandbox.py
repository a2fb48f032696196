"""User reward functions in the sandbox pool: real worker processes, real limits.

Each misbehaving function (raises, hangs, eats memory, kills itself, uses the network,
prints, returns garbage) must cost only its own sample: score 0, error recorded, worker
replaced, the rest of the group scored correctly.
"""

from __future__ import annotations

import os
import socket
import textwrap

import pytest

from reward_svc.decode import load_decoder
from reward_svc.manager import RewardManager
from reward_svc.sandbox.pool import SandboxPool, SandboxSpec
from services.config.reward import RewardConfig
from services.sandbox.process import SandboxStartError
from tests.unit.reward_common import last_valid_index, make_group, write_tokenizer

pytestmark = pytest.mark.timeout(120)

USER_CODE = textwrap.dedent(
    """
    import os, socket, sys

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0, **kw):
        s = solution_str
        if s == "raise":
            raise ValueError("boom from user code")
        if s == "hang":
            while True:
                pass
        if s == "bigalloc":
            x = bytearray(1 << 36)
        if s == "grow":
            chunks = []
            while True:
                chunks.append(bytearray(8 << 20))
        if s == "kill":
            os.kill(os.getpid(), 9)
        if s == "exit":
            os._exit(3)
        if s == "sysexit":
            sys.exit(0)
        if s.startswith("net:"):
            port = int(s.split(":")[1])
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return 5.0
        if s == "print":
            print("garbage on stdout that must not break the protocol")
            sys.stdout.flush()
            os.write(1, b"raw bytes on fd 1")
            return 0.25
        if s == "env":
            return {"score": 1.0, "secret": os.environ.get("MESHRL_TEST_SECRET"), "mine": os.environ.get("MESHRL_REWARD_X")}
        if s == "dict":
            return {"score": 0.5, "acc": True, "pred": "x"}
        if s == "nan":
            return float("nan")
        if s == "object":
            return object()
        if s == "str":
            return "1.0"
        if s == "huge":
            return {"score": 1.0, "blob": "y" * (1 << 20)}
        if s == "nokey":
            return {"acc": 1.0}
        return float(s == ground_truth) + bonus

    def batch_score(data_sources, solution_strs, ground_truths, extra_infos, **kw):
        if "hang" in solution_strs:
            while True:
                pass
        if "short" in solution_strs:
            return [1.0]
        return [{"score": float(s == g), "len": len(s)} for s, g in zip(solution_strs, ground_truths)]
    """
)


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user_reward") / "user_reward.py"
    path.write_text(USER_CODE)
    return str(path)


@pytest.fixture(scope="module")
def pool(user_file):
    saved = {k: os.environ.get(k) for k in ("MESHRL_TEST_SECRET", "MESHRL_REWARD_X")}
    os.environ["MESHRL_TEST_SECRET"] = "hunter2"  # must not reach user code
    os.environ["MESHRL_REWARD_X"] = "for-the-user"
    spec = SandboxSpec(path=user_file, kwargs={"bonus": 0.25}, num_workers=2, call_timeout_s=1.5,
                       memory_limit_mb=512, chunk_size=4)
    try:
        p = SandboxPool(spec).start()  # workers (and their replacements) copy the env at spawn
        yield p
        p.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def items(*texts, truth="a"):
    return [{"data_source": "x", "solution_str": t, "ground_truth": truth, "extra_info": {"i": i}} for i, t in enumerate(texts)]


def check_group(pool, bad, kind, error_part):
    """A group with one bad sample among good ones: only the bad one fails."""
    before = pool.restarts
    res = pool.score(items("a", "b", "a", bad, "a", "b", "a", "a"))
    assert [r.score for i, r in enumerate(res) if i != 3] == [1.25, 0.25, 1.25, 1.25, 0.25, 1.25, 1.25]
    assert all(r.error is None for i, r in enumerate(res) if i != 3)
    assert res[3].score == 0.0 and res[3].kind == kind, res[3]
    assert error_part in res[3].error
    return pool.restarts - before


def test_sandbox_has_no_network(pool):
    assert pool.network == "netns"


@pytest.mark.parametrize("mode, kind, says, restarts", [
    pytest.param("raise", "exception", "boom from user code", 0, id="raising-function"),
    pytest.param("hang", "timeout", "deadline", 1, id="hanging-function-times-out-and-is-replaced"),
    pytest.param("bigalloc", "memory", "MemoryError", 1, id="huge-allocation-hits-the-memory-limit"),
    pytest.param("grow", "memory", "MemoryError", 1, id="growing-allocation-hits-the-memory-limit"),
    pytest.param("kill", "crash", "signal 9", 1, id="self-kill"),
    pytest.param("exit", "crash", "exit code 3", 1, id="os-exit"),
    pytest.param("sysexit", "exception", "SystemExit", 0, id="sys-exit-is-an-error-not-a-death"),
])  # fmt: skip
def test_a_failing_call_is_an_error_of_its_kind_and_the_worker_replaced_only_if_it_died(pool, mode, kind, says, restarts):
    assert check_group(pool, mode, kind, says) == restarts


def test_network_is_blocked(pool):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # reachable from here
        srv.accept()[0].close()
        # inside its own network namespace the worker's loopback is another one: nothing listens there
        check_group(pool, f"net:{port}", "exception", "Connection refused")
        srv.settimeout(0.5)
        with pytest.raises(TimeoutError):
            srv.accept()  # the host's listener never saw the worker's connection


@pytest.mark.parametrize(
    ("bad", "kind", "part"),
    [
        ("nan", "invalid", "finite"),
        ("object", "invalid", "JSON"),
        ("str", "invalid", "want float or dict"),
        ("huge", "invalid", "exceeds"),
        ("nokey", "invalid", "'score'"),
    ],
)
def test_bad_results(pool, bad, kind, part):
    check_group(pool, bad, kind, part)


def test_prints_do_not_break_the_protocol_and_dicts_keep_extras(pool):
    res = pool.score(items("print", "dict", "a"))
    assert [r.score for r in res] == [0.25, 0.5, 1.25]
    assert res[1].extra == {"score": 0.5, "acc": True, "pred": "x"}


def test_every_misbehaviour_in_one_group(pool):
    # (the memory misbehaviour is the one huge allocation: a growing one reaches the limit only
    # as fast as the CPU allows, and on a loaded machine the call's deadline came first; it
    # has its own test above)
    texts = ["a", "hang", "kill", "a", "raise", "bigalloc", "b", "a"]
    res = pool.score(items(*texts))
    assert [r.kind for r in res] == [None, "timeout", "crash", None, "exception", "memory", None, None]
    assert [r.score for r in res] == [1.25, 0, 0, 1.25, 0, 0, 0.25, 1.25]
    assert [r.score for r in pool.score(items("a", "b"))] == [1.25, 0.25]  # still serving


def test_workers_get_a_scrubbed_environment(pool):
    (res,) = pool.score(items("env"))
    assert res.extra == {"score": 1.0, "secret": None, "mine": "for-the-user"}


def test_unserialisable_sample_fails_alone(pool):
    its = items("a", "a", "a")
    its[1]["ground_truth"] = {1, 2}  # a set is not JSON
    res = pool.score(its)
    assert [r.score for r in res] == [1.25, 0.0, 1.25]
    assert res[1].kind == "invalid"


def test_network_allowed_when_configured(user_file):
    p = SandboxPool(SandboxSpec(path=user_file, num_workers=1, allow_network=True, memory_limit_mb=512)).start()
    try:
        assert p.network == "allowed"
        with socket.socket() as srv:
            srv.bind(("127.0.0.1", 0))
            srv.listen()
            res = p.score(items(f"net:{srv.getsockname()[1]}"))
        assert res[0].score == 5.0 and res[0].error is None
    finally:
        p.close()


def test_batch_scorer(user_file):
    spec = SandboxSpec(path=user_file, name="batch_score", num_workers=1, batch_timeout_s=1.5, memory_limit_mb=512)
    p = SandboxPool(spec).start()
    try:
        args = {"data_sources": ["x"] * 3, "solution_strs": ["a", "bb", "a"], "ground_truths": ["a"] * 3, "extra_infos": [None] * 3}
        res = p.score_batch(args, 3)
        assert [r.score for r in res] == [1.0, 0.0, 1.0] and res[1].extra == {"score": 0.0, "len": 2}
        hang = dict(args, solution_strs=["a", "hang", "a"])
        assert [r.kind for r in p.score_batch(hang, 3)] == ["timeout"] * 3
        short = dict(args, solution_strs=["a", "short", "a"])
        assert all("list of 3" in r.error for r in p.score_batch(short, 3))
        assert [r.score for r in p.score_batch(args, 3)] == [1.0, 0.0, 1.0]  # replaced worker serves
    finally:
        p.close()


def test_start_errors_are_clear(tmp_path, user_file):
    with pytest.raises(SandboxStartError, match="not found"):
        SandboxPool(SandboxSpec(path=user_file, name="missing_fn", num_workers=1)).start()
    broken = tmp_path / "broken.py"
    broken.write_text("import definitely_not_a_module_xyz\n")
    with pytest.raises(SandboxStartError, match="definitely_not_a_module_xyz"):
        SandboxPool(SandboxSpec(path=str(broken), num_workers=1)).start()


def test_user_function_through_the_manager(user_file, tmp_path):
    tok = write_tokenizer(tmp_path / "tok")
    cfg = RewardConfig(custom_reward_function={"path": user_file}, num_workers=2, call_timeout_s=1.5, memory_limit_mb=512,
                       extra_columns=["acc", "score", "missing"])
    p = SandboxPool(SandboxSpec(path=user_file, num_workers=2, call_timeout_s=1.5, memory_limit_mb=512)).start()
    try:
        m = RewardManager(cfg, load_decoder(tok), p)
        g = make_group(tok, ["a", "dict", "hang", "a"], ["a"] * 4)
        out, rep = m.score(g)
        assert rep.scores == [1.0, 0.5, 0.0, 1.0]
        tls = out.batch["token_level_scores"]
        last = last_valid_index(g)
        assert [tls[i, last[i]].item() for i in range(4)] == [1.0, 0.5, 0.0, 1.0]
        assert list(out.non_tensor_batch["acc"]) == [None, True, None, None]
        assert list(out.non_tensor_batch["score"]) == [None, 0.5, None, None]
        assert list(out.non_tensor_batch["missing"]) == [None] * 4  # declared: always there
        assert list(out.non_tensor_batch["reward_extra_info"]) == [{}, {"pred": "x"}, {}, {}]
        # a group in which no sample returned a dict has the same columns (groups concatenate)
        out2, _ = m.score(make_group(tok, ["a", "b"], ["a"] * 2, uid="g1"))
        assert set(out2.non_tensor_batch) == set(out.non_tensor_batch)
        from services.protocol import DataProto

        out2.meta_info = dict(out.meta_info)  # (the helper tags meta_info per group)
        assert len(DataProto.concat([out, out2])) == 6
        assert out.non_tensor_batch["error"][2].startswith("reward timeout:")
    finally:
        p.close()


def test_isolated_builtin_scorers(tmp_path):
    """``isolate_builtin``: the built-in dispatcher runs in a sandbox worker, kwargs included."""
    p = SandboxPool(SandboxSpec(path=None, kwargs={"method": "flexible"}, num_workers=1, memory_limit_mb=512)).start()
    try:
        res = p.score([
            {"data_source": "openai/gsm8k", "solution_str": "it is 12", "ground_truth": "12", "extra_info": None},
            {"data_source": "nope", "solution_str": "x", "ground_truth": "1", "extra_info": None},
        ])
        assert res[0].score == 1.0 and res[0].error is None
        assert res[1].kind == "exception" and "nope" in res[1].error
    finally:
        p.close()
