"""Learning-rate schedules as a Plan: the steps a run takes and where its decay starts.

A plan is data, saved in every checkpoint, because it can change while a run goes: a time
budget sets the step count from measured speed, Finish moves the decay to now, and a run
resumed past its end gets a new stable phase and decay. The lr at a step depends only on
the config and the plan, so a resumed run follows the same curve.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from core.config import recipe
from core.config.spec import TrainConfig, from_known


@dataclass
class Plan:
    max_steps: int
    decay_start: int  # the first step of the decay; == max_steps: none of its own (cosine)
    cosine_steps: int = 0  # cosine: the run length the cosine was laid out for
    decay_top: float | None = None  # lr factor the decay starts from; None: the plan's own
    warm_from: int = 0  # where the (last) warmup began: 0, or the step a run was extended at
    finishing: bool = False  # a Finish request set this plan
    provisional: bool = False  # a time budget's guess, redone from the speed each step

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        return from_known(cls, d)


WARMUP_FRACTION = 0.1  # a fine-tune warms up for at most this share of its run (as peers do)


def warmup_steps(cfg: TrainConfig, max_steps: int, warm_from: int = 0) -> int:
    """The warmup a run gets: the config's, never longer than the run, and for a pretrained
    start at most a tenth of it (a short fine-tune must not spend itself warming up)."""
    run = max(1, max_steps - warm_from)
    if cfg.init_from is not None:
        return max(1, min(cfg.warmup_steps, math.ceil(WARMUP_FRACTION * run)))
    return min(cfg.warmup_steps, run)


def _warmup(cfg: TrainConfig, plan: Plan) -> int:
    """A plan's warmup, from the length it was laid out for (a Finish keeps it)."""
    return warmup_steps(cfg, plan.cosine_steps or plan.max_steps, plan.warm_from)


def plan_for(cfg: TrainConfig, max_steps: int, warm_from: int = 0) -> Plan:
    """The schedule laid out for max_steps; warm_from: extending an ended run from there."""
    if cfg.schedule == "cosine":
        return Plan(max_steps, max_steps, cosine_steps=max_steps, warm_from=warm_from)
    decay = max(1, round(cfg.decay_fraction * (max_steps - warm_from)))
    start = max(warm_from + warmup_steps(cfg, max_steps, warm_from), max_steps - decay)
    return Plan(max_steps, min(start, max_steps), warm_from=warm_from)


def _main(step: int, cfg: TrainConfig, plan: Plan) -> float:
    """The factor outside warmup and decay: 1 (wsd's stable phase) or the cosine."""
    if cfg.schedule != "cosine":
        return 1.0
    start = plan.warm_from + _warmup(cfg, plan)
    span = max(1, plan.cosine_steps - start)
    progress = min(1.0, max(0, step - start) / span)
    return cfg.min_lr_ratio + 0.5 * (1 - cfg.min_lr_ratio) * (1 + math.cos(math.pi * progress))


def _decay(progress: float, shape: str) -> float:
    return 1 - math.sqrt(progress) if shape == "sqrt" else 1 - progress


def lr_factor(step: int, cfg: TrainConfig, plan: Plan) -> float:
    """The peak lr's multiplier at step (0-based): warmup, then the main phase, then the
    decay to min_lr_ratio, which the last step reaches."""
    warm, length = step - plan.warm_from, _warmup(cfg, plan)
    if 0 <= warm < length and step < plan.decay_start:
        return (warm + 1) / length * _main(step, cfg, plan)
    if step < plan.decay_start:
        return _main(step, cfg, plan)
    top = plan.decay_top if plan.decay_top is not None else _main(plan.decay_start, cfg, plan)
    length = max(1, plan.max_steps - plan.decay_start)
    progress = min(1.0, (step + 1 - plan.decay_start) / length)
    floor = cfg.min_lr_ratio
    return floor + (top - floor) * _decay(progress, cfg.decay_shape)


def finish_plan(cfg: TrainConfig, plan: Plan, step: int) -> Plan | None:
    """The plan after a Finish request at step: a cooldown from the current lr, or None
    when the run already ends sooner than that."""
    cooldown = cfg.finish_steps or max(1, round(cfg.decay_fraction * step))
    if step + cooldown >= plan.max_steps:
        return None
    top = lr_factor(step, cfg, plan)
    return dataclasses.replace(
        plan, max_steps=step + cooldown, decay_start=step, decay_top=top, finishing=True
    )


def max_steps_for(cfg: TrainConfig, train_tokens: int) -> int:
    if cfg.max_epochs is not None:
        return max(1, math.ceil(cfg.max_epochs * train_tokens / cfg.tokens_per_step))
    return cfg.max_steps


def lr_at(step: int, cfg: TrainConfig, max_steps: int) -> float:
    """AdamW's lr at step (0-based) of a run planned for max_steps from the start."""
    return recipe.adamw_lr(cfg) * lr_factor(step, cfg, plan_for(cfg, max_steps))
