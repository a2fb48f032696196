"""What the controller reports while a job runs: loggers (``trainer.logger``) and
validation rounds (``trainer.test_freq``, ``trainer.val_before_train``).

    tracking = RunTracking(spec, run_dir, history, log=print)
    await tracking.start(prompts_queue, open_queue)   # loggers up; round 0 if val_before_train
    await tracking.tick()                             # each controller poll: log new steps, start/collect rounds
    await tracking.finish(succeeded=True)             # wait for the last round, close the loggers

Every training step the trainer commits is logged once, with the trainer's metrics plus
``staleness/mean`` and ``perf/rollout_tokens_per_s``; every finished validation round is
logged at the step it was started for (``val/...``, see :mod:`controller_svc.validation`),
added to the step history (``summary.json``, ``validation.png``, the dashboard's
``val_score``) and printed as one line. A run resumed in the same run dir does not log or
validate the steps of the earlier run again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller_svc.report import History, val_score

log = logging.getLogger("meshrl.run")

FINAL_ROUND_TIMEOUT_S = 600.0  # how long the end of a job waits for its last validation round


def _last_step(metrics_file: Path | None) -> int:
    if metrics_file is None or not metrics_file.exists():
        return 0
    last = 0
    for line in metrics_file.read_text().splitlines():
        try:
            last = max(last, int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue
    return last


class RunTracking:
    def __init__(self, spec: Any, run_dir: Path, history: History, *, log: Callable[[str], None] = print) -> None:
        self.spec, self.run_dir, self.history, self._log = spec, Path(run_dir), history, log
        t = spec.trainer
        self.test_freq = int(getattr(t, "test_freq", -1))
        self.val_before_train = bool(getattr(t, "val_before_train", False))
        self.loggers = None
        self.val = None
        self.resumed_at = 0
        self._validated: set[int] = set()

    def _wants_validation(self) -> bool:
        return bool(self.spec.data.val_files) and (self.test_freq > 0 or self.val_before_train)

    @property
    def busy(self) -> bool:
        """A validation round is out: its results are to be collected."""
        return self.val is not None and bool(self.val.pending)

    def due(self, step: int) -> bool:
        """Whether training step ``step`` gets a validation round."""
        if self.test_freq <= 0 or step in self._validated or step <= self.resumed_at:
            return False
        return step % self.test_freq == 0 or step == self.spec.trainer.total_steps

    async def start(self, prompts: Any, open_queue: Callable[[str, str], Any]) -> None:
        """Open the loggers and the validation set; ``open_queue(stream, group)`` makes a queue."""
        from controller_svc.tracking import make_loggers

        spec = self.spec
        self.resumed_at = _last_step(self.history.metrics_file)
        t = spec.trainer
        self.loggers = await asyncio.to_thread(
            make_loggers, list(getattr(t, "logger", ["console"])), run_dir=self.run_dir,
            project=getattr(t, "project_name", "meshrl"), experiment=getattr(t, "experiment_name", None) or spec.name,
            config=spec.model_dump(mode="json", by_alias=True))
        if not self._wants_validation():
            return
        from controller_svc.validation import ValidationRunner

        ds = await asyncio.to_thread(self._val_dataset)
        self.val = ValidationRunner(ds, prompts, open_queue("validation", "controller"), n=spec.rollout.val_kwargs.n,
                                    job=spec.name, put_timeout_s=spec.queues.put_timeout_s)
        self._log(f"validation: {len(ds)} prompts x {spec.rollout.val_kwargs.n} samples"
                  + (f", every {self.test_freq} steps" if self.test_freq > 0 else "")
                  + (", and before training" if self.val_before_train and self.resumed_at == 0 else ""))
        if self.val_before_train and self.resumed_at == 0:
            self._validated.add(0)
            self.val.start(0)

    def _val_dataset(self):
        from services.data.prompt_tokenizer import open_prompt_dataset

        spec = self.spec  # (the tokenizer without transformers once used before: services/data/prompt_tokenizer.py)
        return open_prompt_dataset(spec.data.val_files, spec.model.tokenizer_path or spec.model.path,
                                   trust_remote_code=spec.model.trust_remote_code, log=log.info,
                                   max_prompt_length=spec.data.max_prompt_length, truncation=spec.data.truncation,
                                   filter_overlong_prompts=spec.data.filter_overlong_prompts,
                                   prompt_key=spec.data.prompt_key,
                                   chat_template=getattr(spec.data, "chat_template", None))

    async def tick(self) -> None:
        """Log the steps the history picked up since the last tick, start the rounds due,
        and report the rounds that finished."""
        rows, self.history.unlogged = self.history.unlogged, []
        for step, metrics in rows:
            if step <= self.resumed_at:
                continue
            if self.loggers is not None:
                self.loggers.log(metrics, step)
            if self.val is not None and self.due(step):
                self._validated.add(step)
                self.val.start(step)
        if self.val is not None:
            try:
                done = await self.val.poll()
            except Exception as exc:  # noqa: BLE001 - the validation stream is down: try again next tick
                log.warning("validation: reading results failed: %s", exc)
                done = []
            self._report(done)

    def _report(self, done: list[tuple[int, dict[str, float]]]) -> None:
        for step, metrics in done:
            self.history.add_validation(step, metrics)
            if self.loggers is not None:
                self.loggers.log(metrics, step)
            self._log(f"validation at step {step}: score {val_score(metrics):.3f} "
                      f"({int(metrics.get('val/errors', 0))} errors, {metrics.get('val/seconds', 0.0):.0f} s)")

    async def finish(self, *, succeeded: bool) -> None:
        """After the last step: wait for the rounds still running (a successful job only),
        then close the loggers."""
        try:
            if self.val is not None:
                await self.tick()
                if succeeded and self.val.pending:
                    self._log(f"validation: waiting for {self.val.pending} round(s) to finish")
                    self._report(await self.val.drain(FINAL_ROUND_TIMEOUT_S))
                await self.val.close()
                await self.val.results.close()
        finally:
            if self.loggers is not None:
                await asyncio.to_thread(self.loggers.close)
