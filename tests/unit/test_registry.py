"""The config layer knows the services' names without importing the services.

``services.registry`` declares the built-in names (advantage estimators, policy losses,
data sources of the built-in scorers, tool-call parsers); the service packages attach
their real registries when imported. These tests pin the declaration to the real
registries (in a fresh interpreter, so nothing another test registered counts), check
that names user code registers are still accepted, and that ``meshrl validate`` runs
without torch, vLLM or transformers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services import registry
from services.config.job import load_job
from services.config.names import name_problems
from services.data import synthetic
from services.data.parquet import write_rows

ROOT = Path(__file__).resolve().parents[2]
SPEC = str(ROOT / "examples" / "quickstart.yaml")
HEAVY = ("torch", "vllm", "transformers")


def _python(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_declared_builtin_names_are_the_services_registries():
    real = json.loads(_python(
        "import json\n"
        "from trainer_svc import core_algos\n"
        "from reward_svc.scorers import BUILTIN_SCORERS\n"
        "from rollout_svc.agent.parsers import BUILTIN_PARSERS\n"
        "from controller_svc.tracking.base import LOGGERS\n"
        "print(json.dumps({'adv': sorted(core_algos.ADV_ESTIMATOR_REGISTRY),"
        " 'loss': sorted(core_algos.POLICY_LOSS_REGISTRY),"
        " 'scorers': sorted(BUILTIN_SCORERS), 'parsers': sorted(BUILTIN_PARSERS),"
        " 'loggers': sorted(LOGGERS)}))\n"
    ))
    assert sorted(registry.ADV_ESTIMATORS.builtin) == real["adv"]
    assert sorted(registry.POLICY_LOSSES.builtin) == real["loss"]
    assert sorted(registry.SCORERS.builtin) == real["scorers"]
    assert sorted(registry.TOOL_PARSERS.builtin) == real["parsers"]
    assert sorted(registry.LOGGERS.builtin) == real["loggers"]


def test_a_registry_is_its_builtins_plus_what_is_attached():
    names = registry.NameRegistry("thing", ["a", "b"])
    live: dict[str, object] = {}
    names.attach(lambda: live)
    assert "c" not in names and names.names() == {"a", "b"}
    live["c"] = object()  # registered after attaching: seen at the next check
    assert "c" in names and names.names() == {"a", "b", "c"}


@pytest.fixture()
def inputs(tmp_path, tiny_model):
    write_rows(synthetic.arith_rows(4, seed=0), tmp_path / "train.parquet")
    return [f"model.path={tiny_model}", f"data.train_files={tmp_path / 'train.parquet'}", "data.val_files=[]"]


def test_names_registered_in_this_process_are_accepted(inputs, monkeypatch):
    from reward_svc.scorers import BUILTIN_SCORERS
    from trainer_svc import core_algos

    spec = load_job(SPEC, [*inputs, "algorithm.adv_estimator=my_median", "actor.policy_loss.loss_mode=my_loss"])
    assert [p.split(":")[0] for p in name_problems(spec)] == ["algorithm.adv_estimator", "actor.policy_loss.loss_mode"]
    # verl style: register with the decorator, or rebind the registry to a dict of one's own
    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "my_median", lambda **kw: None)
    monkeypatch.setattr(core_algos, "POLICY_LOSS_REGISTRY", {**core_algos.POLICY_LOSS_REGISTRY, "my_loss": None})
    assert name_problems(spec) == []
    monkeypatch.setitem(BUILTIN_SCORERS, "my/source", lambda *a, **kw: 1.0)
    assert "my/source" in registry.SCORERS


def test_validate_imports_no_torch_vllm_or_transformers(inputs):
    """``meshrl validate`` on the quick start's spec (with a real model and data) returns 0
    and leaves none of the heavy modules in ``sys.modules``."""
    argv = ["validate", SPEC, *inputs]
    out = _python(
        "import json, sys\n"
        "from meshrl_cli import main\n"
        f"rc = main({argv!r})\n"
        f"print(json.dumps({{'rc': rc, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    got = json.loads(out.strip().splitlines()[-1])
    assert got == {"rc": 0, "heavy": []}, out

