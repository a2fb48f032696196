"""The names a job spec may use that the services define, known without importing them.

``meshrl validate`` (and ``meshrl run`` before it starts anything) checks that
``algorithm.adv_estimator``, ``actor.policy_loss.loss_mode``, the data sources scored by a
built-in scorer and ``rollout.multi_turn.format`` name something that exists
(:mod:`services.config.names`). What those names stand for lives in the service packages
(the estimators and losses in ``trainer_svc``, which needs torch; the scorers in
``reward_svc``; the tool-call parsers in ``rollout_svc``; the loggers in ``controller_svc``), and the shared core imports no
service package. So each kind of name is a :class:`NameRegistry` here, filled from two
sides:

* ``builtin``: the names the service package itself registers, declared below as plain
  strings. ``tests/unit/test_registry.py`` checks, in a fresh interpreter, that they are
  exactly the service packages' real registries, so the two cannot drift apart;
* the live registries: a service package, when imported, attaches its own registry
  (``ADV_ESTIMATORS.attach(...)`` in ``trainer_svc.algos.registry``), so a name that code
  in this process registered (``@register_adv_est("mine")``, an entry added to
  ``BUILTIN_SCORERS``) is known as well. A process that never imported the package cannot
  have registered anything in it, and the built-in names are all there is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class NameRegistry:
    """The names of one kind (``what``, e.g. "advantage estimator"): the declared built-ins
    plus whatever the attached live registries hold when asked."""

    def __init__(self, what: str, builtin: Iterable[str]) -> None:
        self.what = what
        self.builtin = frozenset(builtin)
        self._live: list[Callable[[], Iterable[str]]] = []

    def attach(self, live: Callable[[], Iterable[str]]) -> None:
        """Add a live registry: ``live()`` returns its names at the time of each check (a
        callable, so a registry that user code rebinds to a new dict is still followed)."""
        self._live.append(live)

    def names(self) -> frozenset[str]:
        out = set(self.builtin)
        for live in self._live:
            out.update(live())
        return frozenset(out)

    def __contains__(self, name: object) -> bool:
        return name in self.names()


#: ``algorithm.adv_estimator`` (``trainer_svc.core_algos.ADV_ESTIMATOR_REGISTRY``).
ADV_ESTIMATORS = NameRegistry("advantage estimator", (
    "gae", "gdpo", "gpg", "grpo", "grpo_passk", "grpo_vectorized", "opo", "optimal_token_baseline",
    "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "rloo_vectorized",
    "tir_optimal_token_baseline",
))

#: ``actor.policy_loss.loss_mode`` (``trainer_svc.core_algos.POLICY_LOSS_REGISTRY``).
POLICY_LOSSES = NameRegistry("policy loss", (
    "bypass_mode", "cispo", "clip_cov", "dppo_kl", "dppo_tv", "dro", "geo_mean", "gpg", "gspo", "kl_cov", "sapo",
    "vanilla",
))

#: The ``data_source`` values a built-in scorer handles (``reward_svc.scorers.BUILTIN_SCORERS``).
SCORERS = NameRegistry("data source with a built-in scorer", (
    "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "arith", "countdown", "gsm8k", "lighteval/MATH",
    "math", "math_verify", "meshrl/arith", "meshrl/countdown", "meshrl/gsm8k", "meshrl/math", "openai/gsm8k",
))

#: Scorer families: every ``data_source`` named ``<family><anything>`` has the family's
#: built-in scorer (``reward_svc.scorers.SCORER_FAMILIES``), e.g. ``reasoning_gym/chain_sum``.
SCORER_FAMILIES = ("math_verify/", "reasoning_gym/")


def scorer_family(data_source: str) -> str | None:
    """The :data:`SCORER_FAMILIES` prefix ``data_source`` falls under (with a name after it)."""
    return next((f for f in SCORER_FAMILIES if data_source.startswith(f) and len(data_source) > len(f)), None)

#: ``rollout.multi_turn.format`` without a dot (``rollout_svc.agent.parsers.BUILTIN_PARSERS``).
TOOL_PARSERS = NameRegistry("tool-call parser", ("hermes", "openai"))

#: ``trainer.logger`` (``controller_svc.tracking.base.LOGGERS``: the controller runs them).
LOGGERS = NameRegistry("logger", ("console", "jsonl", "mlflow", "tensorboard", "wandb"))
