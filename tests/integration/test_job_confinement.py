"""A job's code stays inside its job (docs/security.md), tried from outside over REST.

A real gateway (local launcher, real bubblewrap) runs a stand-in driver
(``sandbox_job.py``) that starts the job's reward sandbox and tool sandbox from the
submitted spec, as the reward service and the replica do. A hostile reward function and a
hostile tool then try to read the gateway's token, its database, another job's run dir and
credential, /etc/shadow; to write outside their scratch; to connect to the gateway and to a
listener on this machine. The same job still scores with honest work on its own input.
Then every row of issue 40's table: a refusal naming the field, or a masked value.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sqlite3
import stat
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from services.pb import job_pb2, job_pb2_grpc
from services.sandbox.confine import bwrap_binary, bwrap_problem
from gateway_svc.launchers.local import LocalLauncher
from tests.integration.gateway_support import STANDIN_DATA, STANDIN_MODEL, TOKEN, VALID_SPEC, auth, running_gateway, wait_until

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(bwrap_problem(bwrap_binary()) is not None, reason="bubblewrap cannot run here")]
REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("sandbox_job.py")
GRPC_AUTH = (("authorization", f"Bearer {TOKEN}"),)

HOSTILE_REWARD = '''
import json, os, socket

def _try(fn):
    try:
        fn()
        return "ok"
    except Exception as exc:
        return type(exc).__name__

def _read(p):
    with open(p, "rb") as fh:
        fh.read(1)

def _write(p):
    with open(p, "w") as fh:
        fh.write("pwned")

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
    probe = extra_info["probe"]
    out = {}
    for p in probe["read"]:
        out["read " + p] = _try(lambda: _read(p))
    for p in probe["write"]:
        out["write " + p] = _try(lambda: _write(p))
    for host, port in probe["connect"]:
        out["connect %s:%s" % (host, port)] = _try(lambda: socket.create_connection((host, port), timeout=2).close())
    # honest work: its own input (the answer key next to it) and its scratch dir
    with open(probe["answers"]) as fh:
        answers = json.load(fh)
    with open(os.path.join(os.environ["TMPDIR"], "note"), "w") as fh:
        fh.write("scratch")
    score = 1.0 if answers.get(solution_str.strip()) == ground_truth else 0.0
    return {"score": score, "probes": json.dumps(out), "uid": os.getuid(), "limits": json.dumps(_limits())}

def _limits():
    """Its resource limits, whether it can raise one, and what its descriptors point at."""
    import resource
    out = {name: list(resource.getrlimit(getattr(resource, "RLIMIT_" + name)))
           for name in ("AS", "CPU", "NPROC", "FSIZE", "NOFILE", "CORE")}
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (out["NPROC"][0] + 1, out["NPROC"][1] + 1))
        out["raise"] = "ok"
    except Exception as exc:
        out["raise"] = type(exc).__name__
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            pass
    out["fds"] = fds
    return out
'''


def _free_listener() -> socket.socket:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    return srv


def test_hostile_reward_function_and_tool_stay_inside_their_sandbox(tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "hostile_reward.py").write_text(HOSTILE_REWARD)
    (inputs / "answers.json").write_text(json.dumps({"42": "42"}))
    token_file = tmp_path / "gateway.token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    # another job's run dir, with its credential
    other = tmp_path / "runs" / "other-job-0000"
    other.mkdir(parents=True)
    (other / "job.credential").write_text("another job's secret")
    (other / "job.credential").chmod(0o600)
    (other / "spec.yaml").write_text("name: other\n")
    launcher = LocalLauncher(command=[sys.executable, str(DRIVER)], env={"PYTHONPATH": str(REPO)})
    with _free_listener() as outside, running_gateway(tmp_path, launcher, input_roots=[inputs, Path(STANDIN_MODEL).parent],
                                                      token_file=token_file) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        port = int(gw.http_url.rsplit(":", 1)[1])
        spec = yaml.safe_load(yaml.safe_dump(VALID_SPEC))
        spec["reward"] = {"custom_reward_function": {"path": str(inputs / "hostile_reward.py")}, "num_workers": 1}
        spec["data"]["val_files"] = [str(inputs / "answers.json")]  # a job input the function reads honestly
        spec["rollout"]["multi_turn"] = {"enable": True, "tools": [
            {"class_name": "tests.agent_tools.Snoop", "num_workers": 1, "timeout_s": 10}]}
        r = c.post("/v1/jobs", json={"spec": spec}, headers=auth())
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        run_dir = tmp_path / "runs" / job_id
        targets = [str(token_file), str(tmp_path / "runs" / "gateway.db"), str(other / "spec.yaml"),
                   str(other / "job.credential"), str(run_dir / "job.credential"), str(run_dir / "spec.yaml"),
                   "/etc/shadow", str(REPO / "pyproject.toml")]
        writes = [str(tmp_path / "pwned"), str(run_dir / "pwned"), str(inputs / "pwned"), "/pwned"]
        connect = [["127.0.0.1", port], ["127.0.0.1", outside.getsockname()[1]]]
        (run_dir / "job.credential").write_text("this job's own credential")
        (run_dir / "probe-request.json").write_text(json.dumps(
            {"read": targets, "write": writes, "connect": connect, "answers": str(inputs / "answers.json")}))
        result = wait_until(lambda: (run_dir / "probe.json").exists() and json.loads((run_dir / "probe.json").read_text()),
                            timeout=90, what="the probes' answers")
        reward = result["reward"]
        assert reward["error"] is None, reward
        assert reward["score"] == 1.0  # honest work inside the sandbox still scores
        probes = [json.loads(reward["extra"]["probes"])]
        tool = result["tools"][0]
        assert tool["ok"] and tool["network"] == "netns", tool
        probes.append(json.loads(tool["result"]["text"]))
        assert probes[1]["scratch"] == "mine"
        for who, got in zip(("reward function", "tool"), probes):
            for p in targets:
                assert got[f"read {p}"] != "ok", (who, p, got)
            for p in writes:
                assert got[f"write {p}"] != "ok", (who, p, got)
            for host, prt in connect:
                assert got[f"connect {host}:{prt}"] != "ok", (who, host, prt, got)
        assert reward["extra"]["uid"] != 0 and probes[1]["uid"] != 0
        # resource limits set before the user code ran, soft = hard, not raisable; no inherited
        # descriptors (the driver holds this job's credential open, inheritable, while it starts them)
        for who, mb, limits in (("reward function", 2048, json.loads(reward["extra"]["limits"])),
                                ("tool", 1024, probes[1]["limits"])):  # the default memory_limit_mb of each
            assert limits["AS"] == [mb << 20] * 2 and limits["CPU"] == [3600] * 2, (who, limits)
            assert limits["NPROC"] == [512] * 2 and limits["FSIZE"] == [1 << 30] * 2, (who, limits)
            assert limits["NOFILE"] == [1024] * 2 and limits["CORE"] == [0, 0], (who, limits)
            assert limits["raise"] != "ok", (who, limits)
            for fd, target in limits["fds"].items():  # fds 1 and 2: the service's stderr (user prints go there)
                assert fd in ("1", "2") or target.startswith(("pipe:", "/dev/null", "/proc/")), (who, fd, target)
                assert "job.credential" not in target, (who, fd, target)
        for p in writes:
            assert not Path(p).exists()
        outside.settimeout(0.2)
        with pytest.raises(TimeoutError):
            outside.accept()

        # pausing the job stops its sandbox workers (they are in the job's process group)
        workers = json.loads((run_dir / "workers.json").read_text())
        assert len(workers) == 2
        assert c.post(f"/v1/jobs/{job_id}:pause", headers=auth()).json()["state"] == "paused"
        tree = [p for w in workers for p in _tree(w)]
        assert len(tree) >= 4  # bwrap, its init in the sandbox, the worker python (x2)
        wait_until(lambda: all(_state(p) in ("T", None) for p in tree), timeout=10, what="workers stopped")
        assert all(_state(p) == "T" for p in tree), {p: _state(p) for p in tree}
        assert c.post(f"/v1/jobs/{job_id}:resume", headers=auth()).json()["state"] == "running"
        wait_until(lambda: all(_state(p) not in ("T",) for p in tree), timeout=10, what="workers running again")
        assert c.post(f"/v1/jobs/{job_id}:cancel", headers=auth()).status_code == 200
        wait_until(lambda: all(_state(p) is None for p in tree), timeout=20, what="workers gone with their job")


def _state(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    st = text[text.rindex(")") + 2:].split()[0]
    return None if st in ("Z", "X") else st


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                text = (d / "stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


# --------------------------------------------------------------------------------- the table, row by row


def _set(spec: dict, dotted: str, value) -> dict:
    node = spec
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return spec


def _spec(**changes) -> dict:
    spec = yaml.safe_load(yaml.safe_dump(VALID_SPEC))
    for dotted, value in changes.items():
        _set(spec, dotted, value)
    return spec


REFUSED = [
    ("reward.custom_reward_function.path", {"reward.custom_reward_function.path": "/etc/passwd"}),
    ("model.trust_remote_code", {"model.trust_remote_code": True}),
    ("rollout.multi_turn.tools[0].sandbox", {"rollout.multi_turn": {"enable": True, "tools": [
        {"class_name": "tests.agent_tools.Echo", "sandbox": False}]}}),
    ("rollout.multi_turn.tools[0].allow_network", {"rollout.multi_turn": {"enable": True, "tools": [
        {"class_name": "tests.agent_tools.Echo", "allow_network": True}]}}),
    ("reward.allow_network", {"reward.allow_network": True}),
    ("trainer.default_local_dir", {"trainer.default_local_dir": "/etc/x"}),
    ("trainer.default_local_dir", {"trainer.default_local_dir": "../../../../etc/x"}),
    ("trainer.metrics_file", {"trainer.metrics_file": "/etc/cron.d/x"}),
    ("weights.snapshot_dir", {"weights.snapshot_dir": "/etc"}),
    ("services.host", {"services.host": "0.0.0.0"}),
    ("model.path", {"model.path": "/root"}),
    ("data.train_files[0]", {"data.train_files": ["/etc/passwd"]}),
    ("model.tokenizer_path", {"model.tokenizer_path": "/etc/shadow"}),
    ("model.lora_adapter_path", {"model.lora_rank": 8, "model.lora_adapter_path": "/root"}),
    ("name", {"name": "ok-name\n"}),
]


def test_every_row_of_the_table_is_refused_naming_its_field(tmp_path):
    with running_gateway(tmp_path, LocalLauncher(command=[sys.executable, "-c", "import time; time.sleep(60)"])) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        stub = job_pb2_grpc.JobServiceStub(grpc.insecure_channel(gw.grpc_address))
        for field, changes in REFUSED:
            spec = _spec(**changes)
            r = c.post("/v1/jobs", json={"spec": spec}, headers=auth())
            assert r.status_code == 400, (field, r.text)
            assert f"{field}:" in r.json()["detail"], (field, r.text)
            with pytest.raises(grpc.RpcError) as err:
                stub.SubmitJob(job_pb2.JobSubmitRequest(spec_yaml=yaml.safe_dump(spec)), metadata=GRPC_AUTH, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details(), field
        # a relative output inside the run dir is fine
        ok = c.post("/v1/jobs", json={"spec": _spec(**{"trainer.default_local_dir": "ckpt/a"})}, headers=auth())
        assert ok.status_code == 201, ok.text
        assert c.get("/v1/jobs", headers=auth()).json()["jobs"][0]["id"] == ok.json()["id"]


def test_the_operator_opens_what_the_spec_cannot(tmp_path):
    launcher = LocalLauncher(command=[sys.executable, "-c", "import time; time.sleep(60)"])
    with running_gateway(tmp_path, launcher, allow=["trust_remote_code,network", "unsandboxed_tools", "bind_any"]) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        for field, changes in REFUSED[1:5] + [REFUSED[9]]:
            r = c.post("/v1/jobs", json={"spec": _spec(**changes)}, headers=auth())
            assert r.status_code == 201, (field, r.text)


def test_a_tool_config_file_cannot_grant_what_the_spec_cannot(tmp_path):
    """A tool config file (verl's layout, a job input the client may have written) asking for a
    tool outside the sandbox or with the network is refused like the spec asking; an honest one
    is read once at submit and its tools go into the job's spec, so changing the file later
    changes nothing the job runs."""
    launcher = LocalLauncher(command=[sys.executable, "-c", "import time; time.sleep(60)"])
    tools_file = tmp_path / "tools.yaml"
    with running_gateway(tmp_path, launcher) as gw, httpx.Client(base_url=gw.http_url, timeout=10) as c:
        stub = job_pb2_grpc.JobServiceStub(grpc.insecure_channel(gw.grpc_address))
        spec = _spec(**{"rollout.multi_turn": {"enable": True, "tool_config_path": str(tools_file)}})
        for field, tool in (("tools[1].sandbox", {"class_name": "tests.agent_tools.Echo", "sandbox": False}),
                            ("tools[1].allow_network", {"class_name": "tests.agent_tools.Echo", "allow_network": True})):
            tools_file.write_text(yaml.safe_dump({"tools": [{"class_name": "tests.agent_tools.Echo"}, tool]}))
            r = c.post("/v1/jobs", json={"spec": spec}, headers=auth())
            assert r.status_code == 400, (field, r.text)
            assert f"rollout.multi_turn.tool_config_path: {field}:" in r.json()["detail"], r.text
            with pytest.raises(grpc.RpcError) as err:
                stub.SubmitJob(job_pb2.JobSubmitRequest(spec_yaml=yaml.safe_dump(spec)), metadata=GRPC_AUTH, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details(), field
        tools_file.write_text(yaml.safe_dump({"tools": [{"class_name": "tests.agent_tools.Echo", "num_workers": 1}]}))
        r = c.post("/v1/jobs", json={"spec": spec}, headers=auth())
        assert r.status_code == 201, r.text
        tools_file.write_text(yaml.safe_dump({"tools": [{"class_name": "tests.agent_tools.Echo", "sandbox": False}]}))
        run_dir = tmp_path / "runs" / r.json()["id"]
        got = c.get(f"/v1/jobs/{r.json()['id']}", headers=auth()).json()
        wait_until(lambda: (run_dir / "spec.yaml").exists(), timeout=20, what="the launched spec")
        for shown in (yaml.safe_load(got["spec"]), yaml.safe_load((run_dir / "spec.yaml").read_text())):
            multi_turn = shown["rollout"]["multi_turn"]
            assert multi_turn["tool_config_path"] is None, multi_turn
            assert [(t["class_name"], t["sandbox"], t["num_workers"]) for t in multi_turn["tools"]] == [
                ("tests.agent_tools.Echo", True, 1)], multi_turn


SECRETS = {"reward.custom_reward_function.reward_kwargs": {"openai_api_key": "sk-LEAK1", "hf_token": "hf_LEAK2",
                                                             "aws_secret_access_key": "AWSLEAK3",
                                                             "header": "Authorization: Bearer LEAK4bearer"},
           "queues": {"type": "redis", "url": "redis://localhost:6379/0", "password": "LEAK5pw"}}
OVERRIDES = ["reward.custom_reward_function.reward_kwargs.extra={api_key: LEAK6}",
             "reward.custom_reward_function.reward_kwargs.my_token=LEAK7"]
LEAKS = [f"LEAK{i}" for i in range(1, 8)]


#: A stand-in job that writes what a real one does (a checkpoint, the broker's AOF) with plain
#: open(): their modes come from the umask the launcher gives the job.
WRITER = ("import os, time; os.makedirs('checkpoints/global_step_1'); "
          "open('checkpoints/global_step_1/model.pt', 'w').write('x'); open('broker.aof', 'w').write('x'); "
          "time.sleep(60)")


def test_secrets_are_masked_everywhere_and_reach_the_job(tmp_path):
    launcher = LocalLauncher(command=[sys.executable, "-c", WRITER])
    old = os.umask(0o022)
    try:
        with running_gateway(tmp_path, launcher) as gw, httpx.Client(base_url=gw.http_url, timeout=10) as c:
            spec = _spec(**SECRETS)
            r = c.post("/v1/jobs", json={"spec": spec, "overrides": OVERRIDES}, headers=auth())
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            seen = [r.text, c.get(f"/v1/jobs/{job_id}", headers=auth()).text, c.get("/v1/jobs", headers=auth()).text,
                    c.get(f"/v1/jobs/{job_id}/events", headers=auth()).text]
            stub = job_pb2_grpc.JobServiceStub(grpc.insecure_channel(gw.grpc_address))
            seen.append(str(stub.GetJob(job_pb2.JobIdRequest(id=job_id), metadata=GRPC_AUTH, timeout=10)))
            seen.append(str(stub.ListJobs(job_pb2.JobListRequest(), metadata=GRPC_AUTH, timeout=10)))
            db = tmp_path / "runs" / "gateway.db"
            with sqlite3.connect(db) as conn:
                seen.append(repr(conn.execute("SELECT * FROM jobs").fetchall()))
                seen.append(repr(conn.execute("SELECT * FROM job_events").fetchall()))
            for text in seen:
                for leak in LEAKS:
                    assert leak not in text, (leak, text[:300])
            assert "***" in seen[1]
            # the job itself got its real secrets (its spec in its run dir, 0600)
            run_dir = tmp_path / "runs" / job_id
            real = (run_dir / "spec.yaml").read_text()
            for leak in LEAKS:
                assert leak in real, leak
            # file modes under umask 022, the job's own files (checkpoints, broker.aof) included
            wait_until(lambda: (run_dir / "broker.aof").exists(), timeout=20, what="the job's files")
            for path, mode in [(db, 0o600), (tmp_path / "runs" / "gateway-access.log", 0o600),
                               (tmp_path / "runs", 0o700), (run_dir, 0o700), (run_dir / "spec.yaml", 0o600),
                               (run_dir / "job.log", 0o600), (run_dir / "checkpoints", 0o700),
                               (run_dir / "checkpoints" / "global_step_1" / "model.pt", 0o600),
                               (run_dir / "broker.aof", 0o600)]:
                assert stat.S_IMODE(path.stat().st_mode) == mode, (path, oct(path.stat().st_mode))
            # a cancelled job's secrets are removed from its run dir
            assert c.post(f"/v1/jobs/{job_id}:cancel", headers=auth()).status_code == 200
            wait_until(lambda: not any(leak in (run_dir / "spec.yaml").read_text() for leak in LEAKS), timeout=20,
                       what="the cancelled job's spec scrubbed")
            assert not (run_dir / "secrets.json").exists()
            # a job cancelled before its launch: its waiting secrets.json goes at once
    finally:
        os.umask(old)


def test_a_cancelled_queued_job_leaves_no_secrets(tmp_path):
    from gateway_svc.server import Gateway, GatewaySettings

    launcher = LocalLauncher(command=[sys.executable, "-c", "import time; time.sleep(60)"])
    settings = GatewaySettings(token=TOKEN, port=0, grpc_port=None, runs_dir=tmp_path / "runs", poll_interval=0.1,
                               cancel_timeout=2.0, max_running_jobs=1, input_roots=[Path(STANDIN_MODEL).parent])
    gw = Gateway(settings, launcher=launcher).start()
    try:
        with httpx.Client(base_url=gw.http_url, timeout=10) as c:
            first = c.post("/v1/jobs", json={"spec": _spec()}, headers=auth()).json()["id"]
            queued = c.post("/v1/jobs", json={"spec": _spec(**SECRETS)}, headers=auth()).json()
            assert queued["state"] == "pending"
            secrets_file = tmp_path / "runs" / queued["id"] / "secrets.json"
            assert secrets_file.exists()
            assert c.post(f"/v1/jobs/{queued['id']}:cancel", headers=auth()).status_code == 200
            assert not secrets_file.exists()
            c.post(f"/v1/jobs/{first}:cancel", headers=auth())
    finally:
        for row in gw.store.list(limit=100):
            if row.handle:
                launcher.cancel(row.handle, timeout=2.0)
        gw.stop()


def test_the_log_route_never_follows_a_symlink_out_of_the_run_dir(tmp_path):
    launcher = LocalLauncher(command=[sys.executable, "-c", "import time; time.sleep(60)"])
    secret = tmp_path / "outside.txt"
    secret.write_text("OUTSIDE-CONTENT\n")
    with running_gateway(tmp_path, launcher) as gw, httpx.Client(base_url=gw.http_url, timeout=10) as c:
        job_id = c.post("/v1/jobs", json={"spec": _spec()}, headers=auth()).json()["id"]
        run_dir = tmp_path / "runs" / job_id
        (run_dir / "logs").mkdir(exist_ok=True)
        (run_dir / "logs" / "x.log").symlink_to(secret)
        (run_dir / "logs" / "real.log").write_text("api_key=LEAKED-IN-LOG fine line\n")
        r = c.get(f"/v1/jobs/{job_id}/logs", params={"service": "x"}, headers=auth())
        assert r.status_code == 404 and "OUTSIDE-CONTENT" not in r.text
        r = c.get(f"/v1/jobs/{job_id}/logs", params={"service": "real"}, headers=auth())
        assert r.status_code == 200 and "fine line" in r.text and "LEAKED-IN-LOG" not in r.text
        # the whole logs dir swapped for a symlink
        (run_dir / "logs" / "real.log").unlink()
        (run_dir / "logs" / "x.log").unlink()
        (run_dir / "logs").rmdir()
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "y.log").write_text("OUTSIDE-CONTENT\n")
        (run_dir / "logs").symlink_to(tmp_path / "elsewhere")
        r = c.get(f"/v1/jobs/{job_id}/logs", params={"service": "y"}, headers=auth())
        assert r.status_code == 404 and "OUTSIDE-CONTENT" not in r.text


def test_user_code_is_refused_without_bubblewrap_unless_the_operator_allows_the_weak_sandbox(monkeypatch):
    from reward_svc.sandbox.pool import SandboxPool, SandboxSpec
    from services.sandbox.process import SandboxStartError

    fn = REPO / "tests" / "integration" / "_weak_probe.py"
    monkeypatch.setenv("MESHRL_BWRAP", "/nonexistent/bwrap")
    monkeypatch.delenv("MESHRL_SANDBOX_WEAK", raising=False)
    fn_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"weak-probe-{os.getpid()}.py"
    fn_path.write_text("def compute_score(*a, **k):\n    return 0.5\n")
    try:
        with pytest.raises(SandboxStartError) as err:
            SandboxPool(SandboxSpec(path=str(fn_path), num_workers=1)).start()
        assert "bubblewrap" in str(err.value) and "weak" in str(err.value) and "\n" not in str(err.value)
        monkeypatch.setenv("MESHRL_SANDBOX_WEAK", "1")
        pool = SandboxPool(SandboxSpec(path=str(fn_path), num_workers=1)).start()
        try:
            assert pool.score([{"data_source": "x", "solution_str": "1", "ground_truth": "1"}])[0].score == 0.5
        finally:
            pool.close()
    finally:
        fn_path.unlink(missing_ok=True)
    assert not fn.exists()
