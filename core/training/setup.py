"""Everything a run does before its first step, and at its end. setup builds the run's
state (core.training.state.RunState) for the Trainer t; t keeps the run's progress.
Before, in the order that keeps bad input from touching the disk: checkpoint checks (resume),
device, data, then the run folder, the model, optimizer and scaler, and the exact state of a
resumed run."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from core.data.windows import check_eval_data, text_windows
from core.errors import CheckpointError
from core.platform.atomic import is_disk_full
from core.platform.compiling import compile_or_eager
from core.platform.device import resolve_device, resolve_precision
from core.runs import checkpoint as ckpt
from core.runs.folder import check_out
from core.training import inputs, objectives, optim, resume
from core.training.schedule import max_steps_for, plan_for
from core.training.state import RunState
from core.training.time_budget import untimed_plan
from core.weights.loader import load_weights


def setup(t) -> RunState:
    """Everything before the first step, in the order that keeps a bad input from touching
    the disk: checkpoint checks, device, data, then the run folder and the model. Returns
    the run's state (and sets the trainer's progress: step, plan, best value, clock)."""
    cfg = t.cfg
    if t.world.main:  # a folder that is not ours is refused before any data is prepared
        check_out(t.folder.path, resuming=t.resume_from is not None)
    objective = objectives.make(cfg)
    check = getattr(objective, "check", None)  # GRPO: its reward functions, before any work
    if check is not None:
        check(cfg)
    if t.resume_from and t.world.main:  # before reading: another may be writing
        t.lock.acquire()
    state = None
    if t.resume_from:
        state = resume.load_resume_state(t.resume_from, cfg, t.pretrained, t.log)
    if cfg.eval_data:  # a wrong path or a short text is named before any data is prepared
        check_eval_data(cfg.eval_data, cfg.seq_len)
    device = resolve_device(t.world.device_name(cfg.device))
    t.owns_group = t.world.init(device)
    precision = resolve_precision(cfg.precision, device)
    data = inputs.prepare_data(
        cfg, t.pretrained, (state or {}).get("data_info"), cache=t.data_cache,
        allow_change=t.allow_data_change, events=t.events,
        stop=t.control.stop_set, log=t.log_early,
    )  # fmt: skip
    check_data = getattr(objective, "check_data", None)  # GRPO: the columns its rewards read
    if check_data is not None:
        check_data(data)
    second_val = None
    if cfg.eval_data:  # the same windows every evaluation: a curve that shows forgetting
        count = cfg.eval_batches * cfg.batch_size * cfg.grad_accum
        second_val = text_windows(cfg.eval_data, data.tokenizer, cfg.seq_len, count)
        t.log_early(f"second validation set: {second_val.source}, {len(second_val.x)} windows")
    elif t.pretrained is not None:
        t.log_early("tip: --eval-data embedded scores general text at every evaluation too, "
                    "so the plot shows what the fine-tune forgets")  # fmt: skip
    # Only now, with the input known good, does a new run get its folder.
    t.folder.create(resuming=state is not None)
    if t.world.main and not t.lock.held:
        t.lock.acquire()
    t.folder.write_data_info(data.summary(), data.tokenizer)
    for message in t.early_logs:
        t.folder.log(message)
    inputs.set_switches(cfg, device)
    t.plan = untimed_plan() if t.budget else plan_for(
        cfg, max_steps_for(cfg, data.train_tokens)
    )  # fmt: skip
    run = build(t, state, device, precision, data, objective)
    run.second_val = second_val
    t.folder.write_status("running", t.step, t.max_steps)
    return run


def build(t, state: dict | None, device, precision: str, data, objective) -> RunState:
    """The model, optimizer and scaler; restored from the checkpoint when resuming."""
    base = t.pretrained.base_record() if t.pretrained is not None else None
    # A fine-tune saved before the fused operations (no "fused" in its shape) keeps the plain
    # ones: its resume stays bit for bit.
    fused = state is None or bool((state.get("model_config") or {}).get("fused"))
    model = inputs.build_model(t.cfg, t.pretrained, device, precision, t.log, fused)
    model = model.to(device)
    optimizer = optim.make(model, t.cfg)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    train_model = compile_or_eager(model, device, t.log) if t.cfg.compile else model
    if t.world.enabled:
        ids = [device.index] if device.type == "cuda" else None
        train_model = DistributedDataParallel(train_model, device_ids=ids)
    run = RunState(device=device, precision=precision, data=data, model=model,
                   train_model=train_model, optimizer=optimizer, scaler=scaler,
                   objective=objective, world=t.world, folder=t.folder, base=base)  # fmt: skip
    # The starting model's view (DPO's reference), before a checkpoint replaces it.
    objective.prepare(run, t.cfg, t.log, t.events, t.control.stop_set)
    if state is not None:
        restore(t, run, state)
    else:
        t.folder.write_config(t.cfg)
    return run


def restore(t, run: RunState, state: dict) -> None:
    """Weights, optimizer, scaler, data position, RNG, step, plan and clock from state."""
    try:
        load_weights(run.model, state)
        run.optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"resume: {t.resume_from} does not fit this model ({e})") from None
    if state.get("scaler"):
        run.scaler.load_state_dict(state["scaler"])
    run.data.load_state_dict(state["data"])
    ckpt.set_rng_state(state["rng"])
    t.step = int(state["step"])
    t.plan = resume.resumed_plan(state, t.cfg, t.step, t.plan,
                                    t.budget is not None, t.log)  # fmt: skip
    t.best_val = float(state.get("best_val", float("inf")))
    t.clock.before = float(state["meta"].get("elapsed_s") or 0.0)
    t.clock.paused_total = float(state["meta"].get("paused_s") or 0.0)
    t.folder.write_config(t.cfg)
    dropped = t.folder.truncate_metrics(t.step)
    t.log(
        f"resumed from {t.resume_from} at step {t.step}"
        + (f"; dropped {dropped} metric records past it" if dropped else "")
    )


def end(status: str, error: str | None, step: int, max_steps: int | None, folder, lock, events,
        log, owns_group: bool) -> dict:  # fmt: skip
    """The run's last word: status.json and the log, the folder closed, the lock and the
    process group released, on_train_end; a full disk here does not hide the real error."""
    result = {"status": status, "step": step, "run_dir": str(folder.path)}
    if error:
        result["error"] = error
    try:
        if folder.path.is_dir() and max_steps is not None:
            extra = {"error": error} if error else {}
            folder.write_status(status, step, max_steps, **extra)
            log(f"{status} at step {step}" + (f": {error}" if error else ""))
        folder.close()
    except OSError as e:  # a full disk must not hide the error that ended the run
        if not is_disk_full(e):
            raise
    lock.release()
    if owns_group:
        torch.distributed.destroy_process_group()
    events.on_train_end(result)
    return result
