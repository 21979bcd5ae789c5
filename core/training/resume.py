"""Going on from a checkpoint: the checks before anything is touched (settings, base model),
and the schedule's plan of a resumed or extended run."""

from __future__ import annotations

from pathlib import Path

from core.config.spec import TrainConfig, compare_for_resume, from_dict, validate
from core.errors import CheckpointError
from core.runs import checkpoint as ckpt
from core.training.schedule import Plan, plan_for
from core.training.time_budget import describe_plan
from core.weights.loader import Pretrained, fingerprint


def load_resume_state(
    path: Path, cfg: TrainConfig, pretrained: Pretrained | None, log, processes: int = 1
) -> dict:
    """The checkpoint's state, once its settings and base model agree with this run (on
    this many processes)."""
    state = ckpt.load(path)
    saved = validate(from_dict(state["config"], source=str(path)))
    before = saved_processes(state, processes)
    refused, allowed = compare_for_resume(saved, cfg, before, processes)
    if refused:
        raise CheckpointError(
            f"resume: {path} was trained with different settings: "
            f"{'; '.join(refused)}. Resume without changing these, or start a new run"
        )
    for change in allowed:
        log(f"resume: allowed change {change}")
    check_base(path, state.get("base"), pretrained)
    return state


def saved_processes(state: dict, processes: int) -> int:
    """How many processes trained the checkpoint (one written before it was recorded: as
    many as now)."""
    return int(state["meta"].get("processes") or processes)


def check_base(path: Path, saved: dict | None, pretrained: Pretrained | None) -> None:
    """A fine-tune resumes only on the base model it started from."""
    if pretrained is None or saved is None:
        return
    now = fingerprint(pretrained.folder)
    if saved["fingerprint"] != now:
        raise CheckpointError(
            f"resume: {path} was fine-tuned from {saved['init_from']} (weights "
            f"{saved['fingerprint']}), but {pretrained.name} now holds other weights "
            f"({now}); point init_from at the original base model"
        )


def limit_of(cfg: TrainConfig) -> list:
    """What the run's length was asked as: a change means a new plan on resume."""
    return [cfg.max_steps, cfg.max_epochs, cfg.max_time, cfg.schedule, cfg.decay_fraction]


def resumed_plan(state: dict, cfg: TrainConfig, step: int, fresh: Plan, timed: bool, log) -> Plan:
    """The saved plan while it still runs (exact resume, a cooldown under way); a new length
    for a run stopped mid-way keeps its curve's start. A run that had ended gets a new plan
    from this step: a warmup back to the peak, then a stable phase and a decay (wsd), or a new
    cosine. fresh is the plan this config makes from step 0."""
    saved = state.get("schedule")
    plan = Plan.from_dict(saved) if saved else None
    end = plan.max_steps if plan else state["meta"].get("max_steps") or 0
    if step < end:
        if plan and (plan.finishing or state["meta"].get("limit") == limit_of(cfg)):
            return plan
        new = plan_for(cfg, fresh.max_steps, warm_from=plan.warm_from if plan else 0)
    elif not timed and fresh.max_steps <= step:
        return fresh  # nothing left to train
    else:
        new = plan_for(cfg, max(fresh.max_steps, step + 1), warm_from=step)
        log(f"extending the run from step {step}: {describe_plan(cfg, new)}")
    new.provisional = timed
    return new
