"""The headless command line: python -m core.train [--preset NAME] [flags].

Every TrainConfig field has its flag, built from the field's Spec in core.config.spec; the
module core.train only forwards here, so `python -m core.train` keeps working.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
from pathlib import Path

from tqdm import tqdm

from core.cli.base import Parser, UsageError, non_negative, run_main
from core.config import presets as preset_lib
from core.config.spec import (
    KINDS,
    LIMITS,
    SPECS,
    TrainConfig,
    check_value,
    describe_limit,
    validate,
)
from core.errors import EXIT_INTERRUPTED, EXIT_OK, ConfigError
from core.platform.device import flush_denormals, gpu_index
from core.platform.distributed import World
from core.runs.events import (
    FanOut,
    TensorBoardEvents,
    TrainControl,
    TrainEvents,
    leave_request,
)
from core.runs.folder import (
    DEFAULT_RUNS_ROOT,
    RunFolder,
    check_out,
    check_resume_out,
    check_writable,
    new_run_dir,
    resume_config,
)
from core.training.trainer import Trainer
from core.use import start_model

METAVARS = {int: "N", float: "X"}


def flag_help(name: str) -> str:
    spec = SPECS[name]
    text = spec.help
    if spec.choices:
        text = f"{' | '.join(spec.choices)}; {text}"
    elif name in LIMITS:
        text = f"{text} ({describe_limit(name)})"
    elif KINDS[name] is bool and getattr(TrainConfig(), name):
        text = f"turn off: {text}"
    return text.replace("%", "%%")  # argparse formats help with %


def add_field_flags(p: argparse.ArgumentParser) -> None:
    """One flag per config field: --name VALUE, or --name / --no-name for booleans (both
    for one that may stay unset)."""
    for name, spec in SPECS.items():
        if not spec.cli:
            continue
        flag = "--" + name.replace("_", "-")
        if KINDS[name] is bool and spec.optional:  # unset: core decides (compile)
            p.add_argument(flag, dest=name, action="store_true", default=None, help=flag_help(name))
            no = "--no-" + flag[2:]
            p.add_argument(
                no,
                dest=name,
                action="store_false",
                default=None,
                help=f"{flag} off, whatever its default",
            )
            continue
        if KINDS[name] is bool:
            default_on = getattr(TrainConfig(), name)
            flag = "--no-" + flag[2:] if default_on else flag
            action = "store_false" if default_on else "store_true"
            p.add_argument(flag, dest=name, action=action, default=None, help=flag_help(name))
            continue
        kind = KINDS[name] if KINDS[name] in (int, float) else str
        metavar = METAVARS.get(kind, name.split("_")[-1].upper())
        # --data again adds a source to the mix, --reward another reward (Spec.repeat)
        action = "append" if spec.repeat else "store"
        p.add_argument(
            flag, type=kind, default=None, metavar=metavar, help=flag_help(name), action=action
        )


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m core.train",
        description="Train a GPT headless. A preset fills in values; flags override it.",
        epilog="Ctrl+C stops after saving a checkpoint (exit 130); resume with --resume latest. "
        "To finish a run early at a low learning rate, send it SIGUSR1 (Linux, macOS) or run "
        "--finish RUN_DIR (any system). "
        "Exit codes: 0 done, 1 failed, 2 bad input, 130 interrupted.",
    )
    p.add_argument("--preset", help="preset name or YAML file (see --list-presets)")
    add_field_flags(p)
    p.add_argument(
        "--data-cache",
        metavar="DIR",
        help="where prepared token files are kept (default: your user cache folder)",
    )
    p.add_argument(
        "--allow-data-change",
        action="store_true",
        help="resume even though the data changed since the checkpoint (logged)",
    )
    p.add_argument(
        "--prepare-only",
        action="store_true",
        help="prepare (tokenize and cache) the data, print its figures and exit",
    )
    p.add_argument("--no-mixed-precision", action="store_true", help="same as --precision fp32")
    p.add_argument("--out", help="run folder (default runs/<preset>-<time>)")
    p.add_argument("--resume", help="RUN_DIR, CHECKPOINT file, or 'latest'")
    p.add_argument(
        "--finish",
        metavar="RUN_DIR",
        help="ask the run training in RUN_DIR to finish: a short lr cooldown, then save and "
        "stop (what SIGUSR1 does; works on Windows too)",
    )
    p.add_argument("--runs-root", default=str(DEFAULT_RUNS_ROOT), help=argparse.SUPPRESS)
    p.add_argument(
        "--monitor",
        action="store_true",
        help="serve a live page of this run for a phone or another computer while it trains "
        "(python -m core.monitor); prints its URL. Private: this computer only, unless "
        "--monitor-host 0.0.0.0",
    )
    p.add_argument(
        "--monitor-host",
        metavar="HOST",
        help="the page's address (implies --monitor; 0.0.0.0: reachable from your network)",
    )
    p.add_argument(
        "--monitor-port",
        metavar="PORT",
        type=non_negative(int),
        help="the page's port (implies --monitor; default 8484 or the next free one; 0: any)",
    )
    p.add_argument(
        "--monitor-control",
        action="store_true",
        help="allow Stop, Save now and Finish from the page (implies --monitor)",
    )
    p.add_argument(
        "--tensorboard",
        action="store_true",
        help="also log to <run>/tensorboard (needs: pip install -e .[tensorboard])",
    )
    p.add_argument("--list-presets", action="store_true", help="list presets and exit")
    p.add_argument("--test-gpu", action="store_true", help="print a GPU diagnostic and exit")
    p.add_argument(
        "--estimate",
        action="store_true",
        help="print the memory estimate, parameters, tokens/step and FLOPs/token; no training",
    )
    return p


def _overrides(args) -> dict:
    values = {n: getattr(args, n) for n, s in SPECS.items() if s.cli}
    values = {n: v for n, v in values.items() if v is not None}  # validate() splits the commas
    if "data" in values:  # the first --data is data, the others are mixed with it
        values["data"], *extra = values["data"]
        values["extra_data"] = extra
    if args.no_mixed_precision:
        values["precision"] = "fp32"
    # The limit the user typed wins over the one the preset carries.
    if "max_epochs" in values:
        values["max_steps"] = None
    elif "max_steps" in values:
        values["max_epochs"] = None
    if "max_time" not in values and ("max_steps" in values or "max_epochs" in values):
        values["max_time"] = None
    return values


def default_preset_name() -> str:
    from core.training.planner import recommend_preset

    return recommend_preset().name


def default_cache_dir() -> Path:
    from core.data.prepare import default_cache_dir

    return default_cache_dir()


def build_config(args) -> tuple[TrainConfig, Path, Path | None]:
    """(config, run folder, checkpoint to resume from or None)."""
    root = Path(args.runs_root)
    if not args.estimate:  # where prepared data goes
        check_writable(
            Path(args.data_cache) if args.data_cache else default_cache_dir(), "--data-cache"
        )
    if args.resume:
        world = World.from_env()
        cfg, resume_file, run = resume_config(
            args.resume, root, args.preset, _overrides(args), world.size, world.launched
        )
        if run.resume_note:
            print(run.resume_note)
            run.log(run.resume_note)
        check_resume_out(run, args.out)
        check_writable(run.path, "--resume")
        check_inputs(cfg)
        return cfg, run.path, resume_file
    runs = not (args.estimate or args.prepare_only) and World.from_env().main  # rank 0 writes
    if args.out and runs:  # before any model is loaded
        check_out(Path(args.out))
    elif runs:
        check_writable(root, "--out (default runs/)")
    base = preset_lib.to_config(preset_lib.load_preset(args.preset or default_preset_name()))
    overrides = _overrides(args)
    cfg = dataclasses.replace(base, **overrides)
    if not args.estimate:  # flags and data before a model is written, loaded or downloaded
        check_inputs(validate(flags_alone(cfg, overrides)), windows=not cfg.init_from)
    if start_model.is_run(cfg.init_from):  # a finished run: its model as a model folder
        folder = start_model.start_folder(cfg.init_from, args.data_cache)
        cfg = dataclasses.replace(cfg, init_from=str(folder))
    if cfg.init_from:  # the model's shape and tokenizer; flags that contradict it are refused
        from core.weights.loader import apply_pretrained, config_only, info_line, open_pretrained

        if args.estimate:  # config.json is all an estimate reads: nothing else is downloaded
            pre = config_only(cfg.init_from)
            print(f"Pretrained model: {pre.name}: {pre.family}, {pre.n_params() / 1e6:,.1f}M")
        else:
            pre = open_pretrained(cfg.init_from)
            print(f"Pretrained model: {pre.name}: {info_line(pre.info())}")
        cfg = apply_pretrained(cfg, pre, explicit=set(overrides))
        if not args.estimate:  # a template without a thinking switch: refused before a run
            from core.data.chat import set_thinking

            set_thinking(pre.tokenizer, cfg.thinking)
    cfg = validate(auto_shard(cfg))
    run_dir = Path(args.out) if args.out else new_run_dir(root, cfg.preset)
    return cfg, run_dir, None


def auto_shard(cfg: TrainConfig) -> TrainConfig:
    """Under torchrun on CUDA cards, --shard without asking where the estimate says the
    whole model does not fit one card but each process's share does (planner.auto_shard)."""
    from core.platform.hardware import gpus

    world = World.from_env()
    if cfg.shard or not world.enabled:
        return cfg
    found = gpus()
    index = gpu_index(world.device_name(cfg.device), len(found))
    if index is None or index >= len(found) or found[index]["free_bytes"] is None:
        return cfg
    from core.training.planner import auto_shard as why_shard

    if (line := why_shard(cfg, world.size, found[index]["free_bytes"])) is None:
        return cfg
    if world.main:
        print(line)
    return dataclasses.replace(cfg, shard=True)


def flags_alone(cfg: TrainConfig, explicit) -> TrainConfig:
    """The config as the flags alone decide it. With init_from, the fields the pretrained
    model fills (its shape, its tokenizer) take neutral values, so that every other refusal
    comes before a start model is written or a model downloaded; each such field the user
    typed is checked on its own here and against the model once it is read. The model can
    only shorten seq_len, so a check that fails at the typed seq_len fails after it too."""
    if not cfg.init_from:
        return cfg
    from core.weights.loader import FILLED_BY_MODEL

    for name in FILLED_BY_MODEL:
        if name in explicit:
            check_value(name, getattr(cfg, name))
    neutral = {name: getattr(TrainConfig(), name) for name in FILLED_BY_MODEL}
    return dataclasses.replace(cfg, **{**neutral, "n_kv_heads": None, "tokenizer": "model"})


def check_inputs(cfg: TrainConfig, windows: bool = True) -> None:
    """Each input's cheap facts (the data sources and their mix, the second validation set,
    the reward files), read before any data is prepared or any model is loaded
    (docs/architecture.md). windows: seq_len is final (a pretrained model may still shorten
    it: the trainer checks then)."""
    from core.data import mix
    from core.data.windows import check_eval_data
    from core.training.rewards import check_files

    mix.check_sources(cfg)
    check_files(cfg)
    if cfg.eval_data and windows:
        check_eval_data(cfg.eval_data, cfg.seq_len)


class CliEvents(TrainEvents):
    """A tqdm progress bar with step, loss, tokens/s and ETA."""

    def __init__(self):
        self.bar = None
        self.prep_bar = None

    def on_prepare(self, phase, done, total):
        bar = self.prep_bar
        if bar is None or bar.desc != phase:
            if bar is not None:
                bar.close()
            bar = self.prep_bar = tqdm(
                total=total, desc=phase, unit="B", unit_scale=True, dynamic_ncols=True
            )
        bar.update(done - bar.n)

    def on_train_start(self, info):
        self.close_prep_bar()
        print(f"Run folder: {info['run_dir']}")
        self.bar = tqdm(
            total=info["max_steps"], initial=info["start_step"], unit="step", dynamic_ncols=True
        )

    def on_train_batch_end(self, record):
        if self.bar is None:
            return
        postfix = {"loss": f"{record['loss']:.4f}", "tok_s": f"{record['tokens_per_s']:.0f}"}
        if record["step"] >= self.bar.total:
            # The last step: draw the final line once, by closing. An update would draw it,
            # every later message would draw it again, and so would the close at the end.
            self.bar.n = record["step"]
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.close()
            self.bar = None
            return
        self.bar.update(record["step"] - self.bar.n)
        self.bar.set_postfix(postfix, refresh=False)

    def on_log(self, message):
        tqdm.write(message)

    def close_prep_bar(self):
        if self.prep_bar is not None:
            self.prep_bar.close()
            self.prep_bar = None

    def on_train_end(self, result):
        self.close_prep_bar()  # preparation failed: the error line comes after the bar
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def print_presets() -> None:
    for p in preset_lib.list_presets():
        kind = "built-in" if p.builtin else "user"
        cfg = preset_lib.to_config(p)
        print(
            f"{p.name:<12} {kind:<8} batch {cfg.batch_size}x{cfg.grad_accum}, hidden "
            f"{cfg.hidden_dim}, layers {cfg.n_layers}, heads {cfg.n_heads}, seq {cfg.seq_len}, "
            f"{cfg.precision}  - {p.description}"
        )


def print_estimate(cfg: TrainConfig) -> None:
    from core.platform.hardware import cpu_info, gpus
    from core.training.estimate import estimate, usable_bytes
    from core.training.planner import checkpoint_line, context_line, heap_line

    found = gpus()
    on_gpu = gpu_index(cfg.device, len(found)) is not None
    if cfg.devices:  # a layer split: a GPU estimate where any of its devices is a card
        on_gpu = any(n != "cpu" for n in cfg.devices.split(","))
    est = estimate(cfg, on_gpu=on_gpu)
    where = "a CUDA GPU" if on_gpu else "the CPU (add --device cuda for a GPU estimate)"
    if cfg.devices:
        where = f"one device, to be split over {cfg.devices}"
    if cfg.shard:  # each process's share (core.training.sharding)
        from core.training.sharding import rank_estimate

        world = World.from_env()
        processes = world.size if world.launched else max(2, len(found))
        est = rank_estimate(est, cfg, processes)
        where += (
            f", per process sharded over {processes} (weights, gradients and optimizer "
            "divided; the root and two blocks gathered whole as 'weight copies')"
        )
    print(
        f"Estimate for preset {cfg.preset or 'custom'} on {where}: "
        f"batch {cfg.batch_size}x{cfg.grad_accum}, seq {cfg.seq_len}, "
        f"hidden {cfg.hidden_dim}, layers {cfg.n_layers}"
        + (f", {line}" if (line := checkpoint_line(cfg, on_gpu)) else "")
    )
    print(est.report())
    if cfg.devices:  # each device's share under the layer split (core.training.split)
        print_split(cfg, est, found, cpu_info()["ram_free_bytes"])
        return
    if not on_gpu:  # which C heap the figures are for, and what this machine's will hold
        print(heap_line(cfg, peak=est.device_total))
    free = found[0]["free_bytes"] if on_gpu and found else cpu_info()["ram_free_bytes"]
    if free is not None:
        print(f"Longest context: {context_line(cfg, free, on_gpu)[0]} (10% margin kept)")
    if found and found[0]["free_bytes"] is not None:
        free = found[0]["free_bytes"]
        verdict = "fits" if est.device_total <= usable_bytes(free) else "does NOT fit"
        print(f"{found[0]['name']}: {free / 1024**3:.1f} GiB free - {verdict} (10% margin kept)")
        if cfg.init_from:
            from core.training.planner import fit_pretrained

            world = World.from_env()  # the cards a run may shard over: torchrun's, or all
            cards = world.size if world.launched else len(found)
            print(f"Fit to this GPU: {fit_pretrained(cfg, free, gpus=cards)[1]}")


def print_split(cfg: TrainConfig, est, found: list[dict], ram_free) -> None:
    from core.training.split import card_rows, free_of

    print(f"Per device, layers split over {cfg.devices} (10% margin kept):")
    for row in card_rows(cfg, est, free_of(cfg, found, ram_free)):
        print("  " + row.line())


def prepare_only(cfg: TrainConfig, cache_dir: str | None) -> int:
    """Prepare every data source (several: each into its own cache entry, one tokenizer)."""
    from core.data import mix
    from core.data.tokenizer import Tokenizer

    tokenizer = pretrained = None
    if cfg.init_from:
        from core.data.chat import set_thinking
        from core.weights.loader import open_pretrained

        pretrained = open_pretrained(cfg.init_from)
        tokenizer = pretrained.tokenizer
        set_thinking(tokenizer, cfg.thinking)
    events = CliEvents()
    cache = Path(cache_dir) if cache_dir else None
    sources = mix.sources_of(cfg)
    try:
        specs = [mix.source_spec(cfg, src, events.on_prepare) for src in sources]
    finally:
        events.close_prep_bar()
    if pretrained is not None:  # how the model sees images (chat data with image parts)
        from core.weights import vision

        vision.tell_specs(specs, pretrained, cfg.image_max_pixels)
    for spec in specs:
        folder, m = _prepare_and_print(spec, cache, tokenizer, events)
        if tokenizer is None:  # the first source's tokenizer encodes the others
            tokenizer = Tokenizer.load(folder / "tokenizer.json", m.get("tokenizer_meta"))
    return EXIT_OK


def _prepare_and_print(spec, cache, tokenizer, events) -> tuple[Path, dict]:
    import time

    from core.data.prepare import examples_line, prepare

    t0 = time.perf_counter()
    try:
        folder, m = prepare(spec, cache, tokenizer, progress=events.on_prepare)
    finally:
        events.close_prep_bar()
    seconds = time.perf_counter() - t0
    tokens = m["train_tokens"] + m["val_tokens"]
    reused = " (reused from the cache)" if seconds < 0.5 * m["prepare_seconds"] else ""
    print(f"Data: {m['source']}")
    print(f"Bytes: {m['source_bytes']:,} of {m['total_bytes']:,}")
    print(
        f"Tokens: {tokens:,} ({m['train_tokens']:,} train, {m['val_tokens']:,} validation), "
        f"{m['tokenizer']} tokenizer, vocab {m['vocab_size']:,}"
    )
    if examples_line(m):
        print(f"Examples: {examples_line(m)}")
    else:
        print(f"Bytes per token: {m['source_bytes'] / max(1, tokens):.3f}")
    print(f"Time: {seconds:.2f} s{reused}")
    print(f"Cache: {folder}")
    return folder, m


def _install_signals(control: TrainControl) -> None:
    def first(signum, frame):
        tqdm.write("Stopping after this step and saving a checkpoint (Ctrl+C again aborts)...")
        control.request_stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def finish(signum, frame):
        tqdm.write("Finishing: a short learning-rate cooldown, then a checkpoint and the end...")
        control.request_finish()

    signal.signal(signal.SIGINT, first)
    if hasattr(signal, "SIGUSR1"):  # not on Windows: there, --finish RUN_DIR
        signal.signal(signal.SIGUSR1, finish)


def ask_to_finish(run_dir: str) -> int:
    """Leave the FINISH request file the trainer looks for once a second."""
    run = RunFolder(Path(run_dir))
    if not run.config_file.is_file():
        raise UsageError(f"--finish: {run_dir} is not a run folder (it has no config.yaml)")
    state = run.read_status().get("state")
    if state != "running":
        raise UsageError(f"--finish: {run_dir} is not training (its status is {state})")
    leave_request(run.path, "finish")
    print(f"Asked {run.path} to finish: it cools the learning rate down, saves and stops.")
    return EXIT_OK


def run_cli(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_presets:
        print_presets()
        return EXIT_OK
    if args.test_gpu:
        from core.platform.hardware import test_gpu_report

        print(test_gpu_report())
        return EXIT_OK
    if args.finish:
        return ask_to_finish(args.finish)
    monitor = bind_monitor(args)  # the port is checked before any work
    child = []
    try:
        return train(args, monitor, child)
    finally:
        for process in child:
            process.close()  # open pages hear of the run's end first


def bind_monitor(args):
    """--monitor: its options, the port checked before any work; started (a process of its
    own, core.monitor.beside) once the run folder is known."""
    given = (args.monitor_host, args.monitor_port)
    wanted = args.monitor or args.monitor_control or any(v is not None for v in given)
    if not wanted or not World.from_env().main:  # under torchrun: rank 0's
        return None
    if args.estimate or args.prepare_only:
        flag = "--estimate" if args.estimate else "--prepare-only"
        raise UsageError(f"--monitor: {flag} trains no run, so there is nothing to watch")
    from core.cli.monitor import monitor_args
    from core.monitor import beside
    from core.monitor.server import LOOPBACK

    options = monitor_args(
        argparse.Namespace(host=args.monitor_host or LOOPBACK, port=args.monitor_port)
    )
    options["control"] = args.monitor_control
    with monitor_flags():
        beside.check_port(options["host"], options["port"], options["explicit_port"])
    return options


@contextlib.contextmanager
def monitor_flags():
    """The monitor's errors, named by this command's flags."""
    try:
        yield
    except ConfigError as e:
        text = str(e).replace("--port", "--monitor-port").replace("--host", "--monitor-host")
        raise ConfigError(text) from None


def start_monitor(options: dict, run_dir: Path):
    from core.monitor.beside import BesideRun

    child = BesideRun(
        run_dir, options["host"], options["port"], options["explicit_port"], options["control"]
    )
    with monitor_flags():
        child.wait_for_link(tqdm.write)
    return child


def train(args, monitor: dict | None, child: list) -> int:
    cfg, run_dir, resume_file = build_config(args)
    if args.estimate:
        print_estimate(cfg)
        return EXIT_OK
    if args.prepare_only:
        return prepare_only(cfg, args.data_cache)
    if monitor is not None:
        child.append(start_monitor(monitor, run_dir))
    control = TrainControl()
    _install_signals(control)
    main_process = World.from_env().main  # under torchrun only rank 0 reports
    if main_process and not args.resume:  # the window's line under Data
        from core.data.describe import cli_data_line

        print(cli_data_line(cfg))
    events = CliEvents() if main_process else TrainEvents()
    if args.tensorboard and main_process:
        events = FanOut(events, TensorBoardEvents())
    trainer = Trainer(
        cfg,
        run_dir,
        resume_from=resume_file,
        data_cache=args.data_cache,
        allow_data_change=args.allow_data_change,
    )
    result = trainer.run(events, control)
    if not main_process:
        return EXIT_OK
    if result["status"] == "cancelled":
        print("Data preparation stopped; nothing was cached and no run was started.")
        return EXIT_INTERRUPTED
    print(f"{result['status'].capitalize()} at step {result['step']}. Run folder: {run_dir}")
    if result["status"] == "stopped":
        print(f"Resume with: python -m core.train --resume {run_dir}")
        return EXIT_INTERRUPTED if control.stop_requested else EXIT_OK
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    flush_denormals()  # before torch's threads start (core.platform.device)
    return run_main(run_cli, argv, crash_hint=" (details in the run's train.log)")


if __name__ == "__main__":
    sys.exit(main())
