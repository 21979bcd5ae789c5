"""Runs planned by time (--max-time) and finished on request (Finish, SIGUSR1, a FINISH file):
the schedule's plan is laid out from the measured speed, or cut short by a cooldown. The
request files of a run folder (FINISH, STOP, SAVE) are read here."""

from __future__ import annotations

import collections
import time
from pathlib import Path

from core.config.spec import TrainConfig
from core.runs.events import REQUEST_FILES
from core.training.schedule import Plan, lr_factor, plan_for

UNTIMED = 10**9  # a time budget's step count before any step was timed
FINISH_FILE = REQUEST_FILES["finish"]  # in the run folder: finish (cooldown, then stop)


def untimed_plan() -> Plan:
    return Plan(UNTIMED, UNTIMED, cosine_steps=UNTIMED, provisional=True)


def describe_plan(cfg: TrainConfig, plan: Plan) -> str:
    if cfg.schedule == "cosine" and not plan.finishing:
        return f"cosine to step {plan.max_steps}"
    return f"decay from step {plan.decay_start} to {plan.max_steps}"


class RequestWatch:
    """A Finish request: from the window or a signal (control), or a FINISH file in the run
    folder, which works on every system (python -m core.train --finish RUN). STOP and SAVE
    files (the web monitor's control mode) become the control's own requests, so they take
    the path the window's Stop and Save now take."""

    def __init__(self, run_dir: Path):
        self.files = {action: run_dir / name for action, name in REQUEST_FILES.items()}
        self._checked = 0.0

    def asked(self, control) -> bool:
        """Whether to finish now; STOP and SAVE files found are handed to control."""
        if control.take_finish_request():
            return True
        now = time.monotonic()
        if now - self._checked < 1.0:  # a stat a second, not one a step
            return False
        self._checked = now
        finish = False
        for action, path in self.files.items():
            if path.exists():
                path.unlink(missing_ok=True)
                if action == "finish":
                    finish = True
                else:
                    control.request(action)
        return finish


class TimeBudget:
    """Lays the steps out from the measured speed (seconds a step, evaluation included) so
    the run ends at the budget; wsd's decay starts, and its length is fixed, when the time
    left is the decay fraction of the budget."""

    def __init__(self, seconds: float, first_step: int):
        self.seconds = seconds
        self.first_step = first_step  # this session's first step: speed is measured from it
        self.marks: collections.deque = collections.deque()  # (step, elapsed_s)
        self.per_step = 0.0  # the last measured seconds a step

    def seconds_per_step(self, step: int, elapsed: float) -> float | None:
        marks = self.marks
        marks.append((step, elapsed))
        # The speed over the last half of this session: start-up costs fall out of it.
        while (marks[0][0] - self.first_step) * 2 < step - self.first_step - 2:
            marks.popleft()
        if step - marks[0][0] < 2:
            return None
        self.per_step = (elapsed - marks[0][1]) / (step - marks[0][0])
        return self.per_step

    def replan(self, cfg: TrainConfig, old: Plan, step: int, elapsed: float) -> Plan:
        """The plan from here; provisional while the speed may still change the length."""
        per_step = self.seconds_per_step(step, elapsed)
        if per_step is None:
            return old
        left = self.seconds - elapsed
        total = step + max(1, round(left / per_step))
        decay_s = cfg.decay_fraction * self.seconds
        if cfg.schedule == "wsd" and left <= decay_s:
            top = lr_factor(step, cfg, old)  # below 1 only if still warming up
            return Plan(total, step, decay_top=top, warm_from=old.warm_from)
        if cfg.schedule == "wsd":
            decay = max(1, round(decay_s / per_step))
            return Plan(
                max(total, step + 2),
                max(total - decay, step + 1),
                warm_from=old.warm_from,
                provisional=True,
            )
        # cosine: its curve needs the length early; fixed after a tenth of the budget
        plan = plan_for(cfg, max(total, step + 1), warm_from=old.warm_from)
        plan.provisional = elapsed < 0.1 * self.seconds
        return plan
