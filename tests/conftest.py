"""Shared pytest configuration.

Fixtures live in ``tests/fixtures/<topic>.py`` (one module per real server or artefact
they provide) and are registered here as plugins, so every test can use them.
"""

import shutil
import tempfile
from pathlib import Path

pytest_plugins = [
    "tests.fixtures.redis",
    "tests.fixtures.broker",
    "tests.fixtures.tiny_model",
    "tests.fixtures.real_model",
    "tests.fixtures.gpu",
]

_credential_dir: str | None = None

#: Modules that start Ray clusters: run one after another on one worker under ``pytest -n``
#: (each starts and stops its own cluster on free ports, but two `ray start` sessions at once
#: would share /tmp/ray and twice the CPUs the machine has).
RAY_MODULES = {"test_run_ray", "test_gateway_ray", "test_ray_serve"}


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest hook
    """The test session is one job: every internal gRPC server and client it starts (and
    every subprocess, through MESHRL_JOB_CREDENTIAL_FILE) shares one job credential."""
    global _credential_dir
    from services import auth

    _credential_dir = tempfile.mkdtemp(prefix="meshrl-test-credential-")
    auth.provision(Path(_credential_dir) / auth.FILE_NAME)


def pytest_xdist_make_scheduler(config, log):  # noqa: ANN001, ANN201 - pytest-xdist hook
    """Under ``pytest -n N`` (README's test command) a module's tests stay on one worker (its
    module-scoped fixture, a fleet or a cluster, starts once), and the Ray modules share one
    worker (:data:`RAY_MODULES`): xdist's by-file scheduling, the Ray files one scope."""
    from xdist.scheduler import LoadFileScheduling

    class ByModule(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "ray" if Path(scope.partition("::")[0]).stem in RAY_MODULES else scope

    return ByModule(config, log)


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001 - pytest hook
    """``podman`` tests (an image build and a whole compose stack) run only when ``-m`` names
    them; otherwise they are deselected (reported as such), never skipped."""
    if "podman" in (config.option.markexpr or ""):
        return
    chosen, dropped = [], []
    for item in items:
        (dropped if item.get_closest_marker("podman") else chosen).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = chosen


def pytest_unconfigure(config) -> None:  # noqa: ANN001 - pytest hook
    if _credential_dir is not None:
        shutil.rmtree(_credential_dir, ignore_errors=True)
