"""Headless CLI: python -m core.train [--preset NAME] [flags]."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from pathlib import Path

from tqdm import tqdm

from . import presets as preset_lib
from .config import LIMITS, TrainConfig, describe_limit, validate
from .distributed import World
from .errors import UserError
from .events import FanOut, TensorBoardEvents, TrainControl, TrainEvents
from .runs import DEFAULT_RUNS_ROOT, new_run_dir, resume_config
from .trainer import Trainer, TrainingError

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

# flag -> config field, for flags that map one to one
FIELD_FLAGS = {
    "batch_size": int, "hidden_dim": int, "n_layers": int, "n_heads": int, "seq_len": int,
    "grad_accum": int, "lr": float, "max_steps": int, "max_epochs": float, "precision": str,
    "device": str, "data": str, "seed": int, "eval_every": int, "ckpt_every": int,
    "log_every": int, "dropout": float, "tokenizer": str, "vocab_size": int,
    "max_data_bytes": int, "beta1": float, "beta2": float, "weight_decay": float,
}  # fmt: skip


FLAG_HELP = {
    "precision": "auto | bf16 | fp16 | fp32 (auto: bf16 or fp16 on CUDA, fp32 on CPU)",
    "device": "auto | cpu | cuda | cuda:N",
    "data": "a text file or a folder of them (default: the embedded corpus)",
    "max_epochs": "passes over the training data (overrides --max-steps)",
    "tokenizer": "bytes (256 tokens, default) | bpe (a byte-level BPE learned from your data)",
    "max_data_bytes": "use only the first N bytes of --data (default: all of it)",
}


class UsageError(UserError):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, as for every other bad input
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m core.train",
        description="Train a byte-level GPT headless. A preset fills in values; flags override it.",
        epilog="Ctrl+C stops after saving a checkpoint (exit 130); resume with --resume latest. "
        "Exit codes: 0 done, 1 failed, 2 bad input, 130 interrupted.",
    )
    p.add_argument("--preset", help="preset name or YAML file (see --list-presets)")
    for name, kind in FIELD_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        help_text = FLAG_HELP.get(name) or f"{LIMITS[name][3]} ({describe_limit(name)})"
        metavar = {"precision": "P", "device": "DEV", "data": "PATH", "tokenizer": "KIND"}.get(
            name, "N"
        )
        p.add_argument(flag, type=kind, default=None, metavar=metavar, help=help_text)
    p.add_argument(
        "--data-extensions", metavar="EXTS",
        help="file endings read from a --data folder, comma separated (default .txt,.md)",
    )  # fmt: skip
    p.add_argument(
        "--data-cache", metavar="DIR",
        help="where prepared token files are kept (default: your user cache folder)",
    )  # fmt: skip
    p.add_argument(
        "--allow-data-change", action="store_true",
        help="resume even though the data changed since the checkpoint (logged)",
    )  # fmt: skip
    p.add_argument(
        "--prepare-only", action="store_true",
        help="prepare (tokenize and cache) the data, print its figures and exit",
    )  # fmt: skip
    p.add_argument(
        "--no-bias", action="store_true",
        help="no biases in Linear and LayerNorm layers (as nanoGPT's bias=False): a bit faster",
    )  # fmt: skip
    p.add_argument("--no-mixed-precision", action="store_true", help="same as --precision fp32")
    p.add_argument("--out", help="run folder (default runs/<preset>-<time>)")
    p.add_argument("--resume", help="RUN_DIR, CHECKPOINT file, or 'latest'")
    p.add_argument("--runs-root", default=str(DEFAULT_RUNS_ROOT), help=argparse.SUPPRESS)
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    p.add_argument(
        "--grad-checkpointing", action="store_true", default=None,
        help="recompute activations in backward: less memory, about 30%% slower",
    )  # fmt: skip
    p.add_argument(
        "--deterministic", action="store_true", default=None,
        help="deterministic kernels, so CUDA runs repeat bit for bit (slower)",
    )  # fmt: skip
    p.add_argument(
        "--tensorboard", action="store_true",
        help="also log to <run>/tensorboard (needs: pip install -e .[tensorboard])",
    )  # fmt: skip
    p.add_argument("--list-presets", action="store_true", help="list presets and exit")
    p.add_argument("--test-gpu", action="store_true", help="print a GPU diagnostic and exit")
    p.add_argument(
        "--estimate",
        action="store_true",
        help="print the memory estimate, parameters, tokens/step and FLOPs/token; no training",
    )
    return p


def _overrides(args) -> dict:
    values = {name: getattr(args, name) for name in FIELD_FLAGS if getattr(args, name) is not None}
    if args.data_extensions is not None:
        values["data_extensions"] = args.data_extensions  # validate() splits the commas
    for name in ("compile", "grad_checkpointing", "deterministic"):
        if getattr(args, name):
            values[name] = True
    if args.no_bias:
        values["bias"] = False
    if args.no_mixed_precision:
        values["precision"] = "fp32"
    # The limit the user typed wins over the one the preset carries.
    if "max_epochs" in values:
        values["max_steps"] = None
    elif "max_steps" in values:
        values["max_epochs"] = None
    return values


def default_preset_name() -> str:
    from .estimate import recommend_preset

    return recommend_preset().name


def build_config(args) -> tuple[TrainConfig, Path, Path | None]:
    """(config, run folder, checkpoint to resume from or None)."""
    root = Path(args.runs_root)
    if args.resume:
        cfg, resume_file, run = resume_config(args.resume, root, args.preset, _overrides(args))
        if run.resume_note:
            print(run.resume_note)
            run.log(run.resume_note)
        if args.out and Path(args.out).resolve() != run.path.resolve():
            raise UsageError(f"--out: a resumed run stays in its own folder {run.path}")
        return cfg, run.path, resume_file
    base = preset_lib.to_config(preset_lib.load_preset(args.preset or default_preset_name()))
    cfg = validate(dataclasses.replace(base, **_overrides(args)))
    run_dir = Path(args.out) if args.out else new_run_dir(root, cfg.preset)
    return cfg, run_dir, None


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
        if self.prep_bar is not None:
            self.prep_bar.close()
            self.prep_bar = None
        print(f"Run folder: {info['run_dir']}")
        self.bar = tqdm(
            total=info["max_steps"], initial=info["start_step"], unit="step", dynamic_ncols=True
        )

    def on_train_batch_end(self, record):
        if self.bar is not None:
            self.bar.update(record["step"] - self.bar.n)
            self.bar.set_postfix(
                loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}", refresh=False
            )

    def on_log(self, message):
        tqdm.write(message)

    def on_train_end(self, result):
        if self.bar is not None:
            self.bar.close()


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
    from .estimate import estimate, usable_bytes
    from .hardware import gpus

    found = gpus()
    on_gpu = cfg.device.startswith("cuda") or (cfg.device == "auto" and bool(found))
    est = estimate(cfg, on_gpu=on_gpu)
    where = "a CUDA GPU" if on_gpu else "the CPU (add --device cuda for a GPU estimate)"
    print(
        f"Estimate for preset {cfg.preset or 'custom'} on {where}: "
        f"batch {cfg.batch_size}x{cfg.grad_accum}, seq {cfg.seq_len}, "
        f"hidden {cfg.hidden_dim}, layers {cfg.n_layers}"
    )
    print(est.report())
    if found and found[0]["free_bytes"] is not None:
        free = found[0]["free_bytes"]
        verdict = "fits" if est.device_total <= usable_bytes(free) else "does NOT fit"
        print(f"{found[0]['name']}: {free / 1024**3:.1f} GiB free - {verdict} (10% margin kept)")


def prepare_only(cfg: TrainConfig, cache_dir: str | None) -> int:
    import time

    from .data import DataSpec, find_sources, prepare

    sources = find_sources(cfg.data, cfg.data_extensions, cfg.corpus_max_bytes, cfg.max_data_bytes)
    spec = DataSpec(sources, cfg.tokenizer, cfg.vocab_size, cfg.val_fraction)
    events = CliEvents()
    t0 = time.perf_counter()
    folder, m = prepare(spec, Path(cache_dir) if cache_dir else None, progress=events.on_prepare)
    seconds = time.perf_counter() - t0
    if events.prep_bar is not None:
        events.prep_bar.close()
    tokens = m["train_tokens"] + m["val_tokens"]
    reused = " (reused from the cache)" if seconds < 0.5 * m["prepare_seconds"] else ""
    print(f"Data: {m['source']}")
    print(f"Bytes: {m['source_bytes']:,} of {m['total_bytes']:,}")
    print(
        f"Tokens: {tokens:,} ({m['train_tokens']:,} train, {m['val_tokens']:,} validation), "
        f"{m['tokenizer']} tokenizer, vocab {m['vocab_size']:,}"
    )
    print(f"Bytes per token: {m['source_bytes'] / max(1, tokens):.3f}")
    print(f"Time: {seconds:.2f} s{reused}")
    print(f"Cache: {folder}")
    return EXIT_OK


def _install_sigint(control: TrainControl) -> None:
    def first(signum, frame):
        tqdm.write("Stopping after this step and saving a checkpoint (Ctrl+C again aborts)...")
        control.request_stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, first)


def run_cli(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_presets:
        print_presets()
        return EXIT_OK
    if args.test_gpu:
        from .hardware import test_gpu_report

        print(test_gpu_report())
        return EXIT_OK
    cfg, run_dir, resume_file = build_config(args)
    if args.estimate:
        print_estimate(cfg)
        return EXIT_OK
    if args.prepare_only:
        return prepare_only(cfg, args.data_cache)
    control = TrainControl()
    _install_sigint(control)
    main_process = World.from_env().main  # under torchrun only rank 0 reports
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
    try:
        return run_cli(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("\nAborted.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        print(f"error: {type(e).__name__}: {e} (details in the run's train.log)", file=sys.stderr)
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
