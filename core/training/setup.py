"""Everything a run does before its first step, and at its end. setup is handed the run's
inputs (core.training.state.RunInputs), returns what it built (RunState) and fills in where
the run stands (Progress: step 0 and the plan, or a checkpoint's) as soon as each is known, so
a run that fails half-way still ends with its plan in status.json. Before, in the order that
keeps bad input from touching the disk: checkpoint checks (resume), device, data, then the
run folder, the model, optimizer and scaler, and the exact state of a resumed run."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from core.data.windows import check_eval_data, text_windows
from core.errors import CheckpointError, ConfigError
from core.models import kernels
from core.models.tiling import MLP_TILE_TOKENS
from core.platform import compiling, heap
from core.platform.atomic import is_disk_full
from core.platform.device import resolve_device, resolve_precision
from core.runs import checkpoint as ckpt
from core.runs.events import clear_requests
from core.runs.folder import check_out
from core.training import inputs, objectives, optim, resume, sharding, split
from core.training.planner import heap_choice
from core.training.schedule import max_steps_for, plan_for
from core.training.state import Progress, RunInputs, RunState
from core.training.time_budget import untimed_plan
from core.weights.loader import load_weights


def setup(given: RunInputs, progress: Progress, events, stop) -> RunState:
    """Everything before the first step, in the order that keeps a bad input from touching
    the disk: checkpoint checks, device, data, then the run folder and the model. events
    hears the log and the data preparation; stop() cancels the preparation."""
    cfg, folder, world, lock = given.cfg, given.folder, given.world, given.lock
    early: list[str] = []  # said before the run folder exists: written to its log after

    def log_early(message: str) -> None:
        early.append(message)
        events.on_log(message)

    def log(message: str) -> None:
        folder.log(message)
        events.on_log(message)

    heap.chosen_mode()  # a bad TRAINDECK_HEAP is refused before any work
    sharding.check(cfg, world)
    split.check(cfg, world)
    if world.main:  # a folder that is not ours is refused before any data is prepared
        check_out(folder.path, resuming=given.resume_from is not None)
    objective = objectives.make(cfg)
    objective.check(cfg)  # GRPO: its reward functions, before any work
    if given.resume_from and world.main:  # before reading: another may be writing
        lock.acquire()
    state = None
    if given.resume_from:
        state = resume.load_resume_state(given.resume_from, cfg, given.pretrained, log, world.size)
    if cfg.eval_data:  # a wrong path or a short text is named before any data is prepared
        check_eval_data(cfg.eval_data, cfg.seq_len)
    first = split.names(cfg)[0] if cfg.devices else cfg.device  # a split's home: the first
    device = resolve_device(world.device_name(first))
    world.init(device, alone_too=cfg.shard)
    precision = resolve_precision(cfg.precision, device)
    data = objective.load_data(
        cfg,
        given.pretrained,
        (state or {}).get("data_info"),
        cache=given.data_cache,
        allow_change=given.allow_data_change,
        events=events,
        stop=stop,
        log=log_early,
    )
    objective.check_data(data)  # GRPO: the columns its rewards read
    if cfg.train_vision and getattr(data, "images", None) is None:
        raise ConfigError(
            "train_vision: the data holds no images, so the vision tower would not train; "
            "train on chat data with images, or leave train_vision off",
            field="train_vision",
        )
    second_val = None
    if cfg.eval_data:  # the same windows every evaluation: a curve that shows forgetting
        count = cfg.eval_batches * cfg.batch_size * cfg.grad_accum
        second_val = text_windows(cfg.eval_data, data.tokenizer, cfg.seq_len, count)
        log_early(f"second validation set: {second_val.source}, {len(second_val.x)} windows")
    elif given.pretrained is not None:
        log_early(
            "tip: --eval-data embedded scores general text at every evaluation too, "
            "so the plot shows what the fine-tune forgets"
        )
    # Only now, with the input known good, does a new run get its folder.
    folder.create(resuming=state is not None)
    if world.main and not lock.held:
        lock.acquire()
    folder.write_data_info(data.summary(), data.tokenizer)
    for message in early:
        folder.log(message)
    lean = False
    if device.type == "cpu":  # which C heap, and why (core.platform.heap)
        choice = heap_choice(cfg)
        lean = choice.lean
        kind = "lean C heap (less memory, steps up to 45% slower)" if lean else "fast C heap"
        log(f"the {kind}: {choice.why}")
    inputs.set_switches(cfg, device, lean)
    progress.plan = (
        untimed_plan() if given.timed else plan_for(cfg, max_steps_for(cfg, data.train_tokens))
    )
    run = build(given, state, device, precision, data, objective, events, stop, log)
    run.second_val = second_val
    if state is not None:
        restore(given, run, state, progress, log)
    else:
        folder.write_config(cfg)
    if world.main:  # requests are read from here on (a watcher sends them once it sees this)
        clear_requests(folder.path)
    folder.write_status("running", progress.step, progress.plan.max_steps)
    return run


def build(
    given: RunInputs, state: dict | None, device, precision: str, data, objective, events, stop, log
) -> RunState:
    """The model, optimizer and scaler, and what the objective makes from the starting
    model (DPO's reference) before a checkpoint's weights replace it."""
    cfg, pretrained = given.cfg, given.pretrained
    base = pretrained.base_record() if pretrained is not None else None
    # A fine-tune saved before the fused operations (no "fused" in its shape) keeps the plain
    # ones: its resume stays bit for bit.
    fused = state is None or bool((state.get("model_config") or {}).get("fused"))
    model = inputs.build_model(cfg, pretrained, device, precision, log, fused)
    if getattr(data, "images", None) is not None:  # the tower in the forward pass
        inputs.attach_vision(model, pretrained, cfg, log)
    if cfg.devices:  # each block onto its card (core.training.split), the rest on the first
        place_split(cfg, model, precision, device, log)
    else:
        model = model.to(device)
    use_kernels(cfg, model, device, log)
    if cfg.shard:  # before the optimizer: its state is made for the shards
        sharding.shard(model, device, precision)
        log(sharding.held_line(model, given.world.size))
    optimizer = optim.make(model, cfg)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    train_model = compiled_model(cfg, model, device, log)
    if given.world.enabled and not cfg.shard:
        ids = [device.index] if device.type == "cuda" else None
        train_model = DistributedDataParallel(train_model, device_ids=ids)
    run = RunState(
        device=device,
        precision=precision,
        data=data,
        model=model,
        train_model=train_model,
        optimizer=optimizer,
        scaler=scaler,
        objective=objective,
        world=given.world,
        folder=given.folder,
        base=base,
        compiled=getattr(train_model, "parts", None) if train_model is not model else None,
    )
    objective.prepare(run, cfg, log, events, stop)
    return run


def place_split(cfg, model, precision: str, device, log) -> None:
    """The layer split: the plan by the estimate and each device's free memory."""
    from core.training.estimate import estimate

    est = estimate(cfg, precision, on_gpu=device.type == "cuda")
    devices = [torch.device(n) for n in split.names(cfg)]
    plan, _ = split.card_estimates(est, cfg, split.free_memory(devices))
    split.place(model, plan)
    log(f"layer split over {len(devices)} devices: {plan.describe()}")


def use_kernels(cfg, model, device, log) -> None:
    """The device's kernel set put on the model, once (core.models.kernels: the torch path
    on the CPU, Liger's kernels and LoRA's own autograd on a CUDA GPU); said on a GPU."""
    chosen = kernels.choose(device, log)
    tiles = cfg.seq_len > MLP_TILE_TOKENS
    chosen.install(model, blocks_eager=not compiling.wanted(cfg.compile, device.type, tiles))
    if device.type == "cuda":
        log(chosen.describe())


def compiled_model(cfg, model, device, log) -> torch.nn.Module:
    """The model compiled where the run compiles (core.platform.compiling.wanted: by default
    on a CUDA GPU, where the sequences are not so long that the model runs in tiles), or the
    model itself."""
    tiles = cfg.seq_len > MLP_TILE_TOKENS
    if compiling.wanted(cfg.compile, device.type, tiles):
        return compiling.compile_or_eager(model, device, log, mode=cfg.compile_mode)
    if device.type == "cuda" and cfg.compile is False:  # said: a GPU compiles by default
        log("torch.compile: off (--no-compile); the model trains eager")
    elif device.type == "cuda":
        log(
            f"torch.compile: off at seq_len {cfg.seq_len:,} (over {MLP_TILE_TOKENS:,} the "
            "model runs in tiles, which hold less memory than compiled blocks; --compile "
            "compiles anyway)"
        )
    return model


def restore(given: RunInputs, run: RunState, state: dict, progress: Progress, log) -> None:
    """Weights, optimizer, scaler, data position and RNG from state into run; the
    checkpoint's step, plan (progress holds this config's plan from step 0), best value and
    clock into progress."""
    try:
        if (shards := ckpt.shards_of(given.resume_from, state)) is not None:
            adapters = bool(state.get("adapters_only"))
            sharding.load_shards(run.model, run.optimizer, shards, adapters)
        elif sharding.is_sharded(run.model):  # saved by one process: each rank takes its rows
            sharding.load_whole(run.model, run.optimizer, state)
        else:
            load_weights(run.model, state)
            run.optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(
            f"resume: {given.resume_from} does not fit this model ({e})"
        ) from None
    if state.get("scaler"):
        run.scaler.load_state_dict(state["scaler"])
    run.data.load_state_dict(state["data"])
    ckpt.set_rng_state(state["rng"])
    step = progress.step = int(state["step"])
    progress.plan = resume.resumed_plan(state, given.cfg, step, progress.plan, given.timed, log)
    progress.best_val = float(state.get("best_val", float("inf")))
    progress.elapsed_s = float(state["meta"].get("elapsed_s") or 0.0)
    progress.paused_s = float(state["meta"].get("paused_s") or 0.0)
    given.folder.write_config(given.cfg)
    dropped = given.folder.truncate_metrics(step)
    log(
        f"resumed from {given.resume_from} at step {step}"
        + (f"; dropped {dropped} metric records past it" if dropped else "")
    )


def end(
    status: str,
    error: str | None,
    step: int,
    max_steps: int | None,
    folder,
    lock,
    events,
    log,
    owns_group: bool,
) -> dict:
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
