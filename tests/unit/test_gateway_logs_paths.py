"""The gateway's log reading (tail, follow, which names are accepted) and its submit-time
path checks, on real files."""

from __future__ import annotations

import threading
import time

import pytest

from gateway_svc import logs
from gateway_svc.paths import path_problems


def test_tail_returns_the_last_lines_whatever_the_file_ends_with(tmp_path):
    f = tmp_path / "a.log"
    f.write_bytes(b"".join(f"line {i}\n".encode() for i in range(100_000)))
    head, size = logs.tail_bytes(f, 3)
    assert head == b"line 99997\nline 99998\nline 99999\n" and size == f.stat().st_size
    f.write_bytes(b"one\ntwo\nthree")  # no newline at the end
    assert logs.tail_bytes(f, 2)[0] == b"two\nthree"
    assert logs.tail_bytes(f, 50)[0] == b"one\ntwo\nthree"
    assert logs.tail_bytes(f, 0)[0] == b""
    f.write_bytes(b"")
    assert logs.tail_bytes(f, 5) == (b"", 0)
    f.write_bytes(b"x" * (logs.MAX_TAIL_BYTES + 10_000))  # one enormous line: bounded
    assert len(logs.tail_bytes(f, 1)[0]) <= logs.MAX_TAIL_BYTES


def test_follow_yields_appended_bytes_and_stops_when_the_job_finishes(tmp_path):
    f = tmp_path / "a.log"
    f.write_bytes(b"old\n")
    done = threading.Event()

    def writer():
        for i in range(5):
            with open(f, "ab") as out:
                out.write(f"new {i}\n".encode())
            time.sleep(0.05)
        done.set()

    threading.Thread(target=writer).start()
    got = b"".join(logs.follow(f, 4, done.is_set, max_seconds=30, poll=0.02))  # ticks are b""
    assert got == b"".join(f"new {i}\n".encode() for i in range(5))


class FakeClock:
    """Stands in for the ``time`` module in gateway_svc.logs: ``sleep`` moves the clock,
    nothing else does, so deadlines are counted in polls, not measured."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1


def test_a_follow_of_a_job_that_never_finishes_ends_at_max_seconds(tmp_path, monkeypatch):
    f = tmp_path / "a.log"
    f.write_bytes(b"old\n")
    clock = FakeClock()
    monkeypatch.setattr(logs, "time", clock)
    finished = []
    ticks = list(logs.follow(f, f.stat().st_size, lambda: finished.append(1) and False, max_seconds=1.0, poll=0.25))
    # nothing appended: one empty tick per poll until the deadline, then the stream ends
    assert ticks == [b""] * 4 and clock.now == 1.0 and len(finished) == 4


def test_only_logs_found_in_the_run_dir_can_be_named(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "job.log").write_text("driver\n")
    (tmp_path / "logs" / "trainer.log").write_text("t\n")
    (tmp_path / "logs" / "rollout-0.log").write_text("r\n")
    (tmp_path / "spec.yaml").write_text("secret: 1\n")
    assert logs.log_services(tmp_path) == ["job", "rollout-0", "trainer"]
    assert logs.log_path(tmp_path, "trainer") == tmp_path / "logs" / "trainer.log"
    assert logs.log_path(tmp_path, "job") == tmp_path / "job.log"
    for bad in ("../spec", "spec", "trainer.log", "/etc/passwd", "", "reward-0"):
        with pytest.raises(logs.UnknownLog, match="logs: job, rollout-0, trainer"):
            logs.log_path(tmp_path, bad)
    with pytest.raises(logs.UnknownLog, match="none yet"):
        logs.log_path(tmp_path / "nothing", "job")


def test_path_problems_name_each_relative_or_missing_path(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    data = tmp_path / "train.parquet"
    data.write_bytes(b"x")
    fn = tmp_path / "score.py"
    fn.write_text("def compute_score(*a): return 0.0\n")
    good = {"model": {"path": str(model)}, "data": {"train_files": [str(data)], "val_files": []},
            "reward": {"custom_reward_function": {"path": str(fn)}, "reward_model": {"enable": False, "path": "rm"}}}
    assert path_problems(good) == []
    # an importable module is not a file path; a disabled reward model's path is not checked
    assert path_problems({**good, "reward": {"custom_reward_function": {"path": "my_pkg.scores"}}}) == []
    bad = {"model": {"path": str(data), "tokenizer_path": "tok"},
           "data": {"train_files": [str(data), str(tmp_path / "gone.parquet")], "val_files": [str(model)]},
           "reward": {"custom_reward_function": {"path": "fns/score.py"},
                      "reward_model": {"enable": True, "path": str(tmp_path / "rm")}},
           "critic": {"model_path": "~/nowhere-" + tmp_path.name},
           "rollout": {"multi_turn": {"tool_config_path": "tools.yaml"}}}  # fmt: skip
    assert path_problems(bad) == [
        f"model.path: {data} is not a directory",
        "model.tokenizer_path: relative path 'tok' (the job runs in its own run dir: give an absolute path)",
        f"data.train_files[1]: {tmp_path / 'gone.parquet'} does not exist",
        f"data.val_files[0]: {model} is not a file",
        "reward.custom_reward_function.path: relative path 'fns/score.py' (the job runs in its own run dir: give an absolute path)",
        f"reward.reward_model.path: {tmp_path / 'rm'} does not exist",
        f"critic.model_path: ~/nowhere-{tmp_path.name} does not exist",
        "rollout.multi_turn.tool_config_path: relative path 'tools.yaml' (the job runs in its own run dir: give an absolute path)",
    ]


def test_an_idle_follow_ticks_so_a_gone_client_frees_its_reader(tmp_path, monkeypatch):
    f = tmp_path / "a.log"
    f.write_bytes(b"")
    clock = FakeClock()
    monkeypatch.setattr(logs, "time", clock)
    it = logs.follow(f, 0, lambda: False, max_seconds=3600, poll=0.02)
    assert next(it) == b""  # nothing written: control comes back after one poll, not after max_seconds
    assert clock.sleeps == 1 and clock.now == 0.02
    f.write_bytes(b"late\n")
    assert next(it) == b"late\n"  # and the reader still works when the caller goes on
    it.close()
