"""Helpers for the gateway tests: a real gateway on loopback running real (stand-in) jobs."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from gateway_svc.launchers.local import LocalLauncher

FAKE_JOB = Path(__file__).with_name("gateway_fake_job.py")
FAKE_FLEET = Path(__file__).with_name("gateway_fake_fleet.py")
TOKEN = "test-token-0123456789"



def _standin_files() -> tuple[str, str]:
    """An existing model dir and data file: the gateway refuses relative or missing paths at
    submit, and the stand-in driver never reads them."""
    import tempfile

    root = Path(tempfile.gettempdir()) / "meshrl-gateway-standin"
    (root / "tiny-model").mkdir(parents=True, exist_ok=True)
    (root / "train.parquet").touch()
    return str(root / "tiny-model"), str(root / "train.parquet")


STANDIN_MODEL, STANDIN_DATA = _standin_files()

#: The smallest spec the job schema accepts (the stand-in driver does not read its fields).
VALID_SPEC: dict[str, Any] = {
    "name": "arith-test",
    "model": {"path": STANDIN_MODEL},
    "data": {"train_files": [STANDIN_DATA], "train_batch_size": 4},
    "actor": {"ppo_mini_batch_size": 4},
    "rollout": {"n": 2},
}
VALID_SPEC_YAML = yaml.safe_dump(VALID_SPEC)


def fake_launcher(**env: str | int | float) -> LocalLauncher:
    """A LocalLauncher whose driver is the stand-in job program (FAKE_* knobs as env)."""
    return LocalLauncher(command=[sys.executable, str(FAKE_JOB)], env={k: str(v) for k, v in env.items()})


def wait_until(pred: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``pred`` until truthy; fail the test (not hang) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextmanager
def running_gateway(tmp_path: Path, launcher: LocalLauncher, db_url: str | None = None, grpc: bool = True,
                    allow: list[str] | None = None, input_roots: list[Path] | None = None,
                    token_file: Path | None = None, fleet_command: list[str] | None = None,
                    fleet_env: dict[str, str] | None = None, keep_fleets: bool = False) -> Iterator[Any]:  # fmt: skip
    """A real gateway (uvicorn + gRPC) on free loopback ports; stopped and jobs cancelled after,
    and its fleets stopped (unless ``keep_fleets``: a restarted gateway is to find them).
    Its input roots: the stand-in files' directory and ``tmp_path`` (unless given).
    ``fleet_command``: its fleets' program (default the real ``python -m fleet_svc start``)."""
    from gateway_svc.server import Gateway, GatewaySettings

    if input_roots is None:
        input_roots = [Path(STANDIN_MODEL).parent, tmp_path]
    settings = GatewaySettings(
        token=TOKEN, host="127.0.0.1", port=0, grpc_port=0 if grpc else None, db_url=db_url,
        runs_dir=tmp_path / "runs", poll_interval=0.1, cancel_timeout=2.0, allow=allow or [],
        input_roots=input_roots, token_file=token_file,
    )  # fmt: skip
    gw = Gateway(settings, launcher=launcher)
    if fleet_command is not None:
        gw.fleets.command = list(fleet_command)
    gw.fleets.env.update(fleet_env or {})
    gw.start()
    try:
        yield gw
    finally:
        for row in gw.store.list(limit=1000):
            if row.handle and row.state in ("running", "paused", "pending", "cancelled"):
                launcher.cancel(row.handle, timeout=2.0)
        if not keep_fleets:
            stop_fleets(gw.fleets)
        gw.stop()


def stop_fleets(fleets: Any, timeout: float = 120.0) -> None:
    """Stop every running fleet of a gateway's FleetManager (their own stop protocol; SIGKILL
    to the fleet's process group if it is still there after ``timeout``)."""
    import os
    import signal

    for view in fleets.list():
        if view["state"] not in ("starting", "ready", "stopping"):
            continue
        try:
            fleets.stop(view["name"], timeout=timeout)
        except Exception:  # noqa: BLE001 -- still there: end its whole group
            if view.get("pid"):
                try:
                    os.killpg(view["pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
