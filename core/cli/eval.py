"""python -m core.eval RUN|CHECKPOINT|MODEL_FOLDER|HUB_ID [--text FILE] [--choices FILE]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from core.cli.base import Parser, UsageError, non_negative, run_main
from core.errors import EXIT_OK
from core.use import evaluate
from core.weights.loader import load


def build_parser() -> Parser:
    p = Parser(prog="python -m core.eval", description="Evaluate a model on text or questions.")
    p.add_argument("target", help="a run folder, a checkpoint file, a model folder or hub id")
    p.add_argument("--text", metavar="FILE", help="perplexity and bits per byte of this text")
    p.add_argument(
        "--choices", metavar="FILE",
        help="multiple-choice accuracy (acc, acc_norm) on .jsonl, .csv or .parquet questions",
    )  # fmt: skip
    p.add_argument("--fewshot", type=non_negative(int), default=0, metavar="K",
                   help="show the first K questions, answered, before each other")  # fmt: skip
    p.add_argument("--limit", type=non_negative(int), default=None, metavar="N",
                   help="score at most N questions")  # fmt: skip
    p.add_argument(
        "--compare", action="store_true",
        help="a fine-tune: also evaluate the model it started from, side by side",
    )  # fmt: skip
    p.add_argument("--checkpoint", choices=("best", "latest"), default="best")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _bar(total: int, unit: str):
    bar = tqdm(total=total, unit=unit, file=sys.stderr, disable=not sys.stderr.isatty())
    return bar, bar.update


def run_cli(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.text and not args.choices:
        raise UsageError("give --text FILE, --choices FILE or both")
    for name in ("text", "choices"):
        path = getattr(args, name)
        if path and not Path(path).is_file():
            raise UsageError(f"--{name}: {path} not found")
    items = evaluate.read_choices(args.choices) if args.choices else None
    if items is not None and args.limit is not None:
        items = items[: args.fewshot + args.limit]
    loaded = load(args.target, args.checkpoint)
    start = None
    if args.compare:
        base = loaded.base["init_from"] if loaded.base else None
        if base is None:
            raise UsageError("--compare: the target is not a fine-tune of a pretrained model")
        start = load(base)
    out = measure(loaded, args, items, write=True)
    if start is not None:
        out["start"] = measure(start, args, items, write=False)
    print(json.dumps(out) if args.json else table(out))
    return EXIT_OK


def measure(loaded, args, items, write: bool) -> dict:
    out = {}
    if args.text:
        text = Path(args.text).read_text(encoding="utf-8", errors="replace")
        bar, tick = _bar(len(text.encode()) // 4, "tok")
        out["text"] = evaluate.text_metrics(loaded, text, tick)
        bar.close()
        if write:
            evaluate.write_result(loaded, Path(args.text), "text", {}, out["text"])
    if items is not None:
        bar, tick = _bar(len(items) - args.fewshot, "q")
        out["choices"] = evaluate.choice_metrics(loaded, items, args.fewshot, tick)
        bar.close()
        if write:
            settings = {"fewshot": args.fewshot, "limit": args.limit}
            evaluate.write_result(loaded, Path(args.choices), "choices", settings, out["choices"])
    return out


ROWS = {"text": ("ppl", "bpb"), "choices": ("acc", "acc_norm", "n")}


def table(out: dict) -> str:
    """metric, value (and with --compare: the start model's value beside it)."""
    start = out.get("start")
    head = [f"{'':<8} {'':<9} {'start':>10} {'fine-tuned':>10}"] if start else []
    rows = []
    for part, keys in ROWS.items():
        for key in keys if part in out else ():
            values = ([start[part][key]] if start else []) + [out[part][key]]
            cells = " ".join(f"{v:>10.4f}" if isinstance(v, float) else f"{v:>10}" for v in values)
            rows.append(f"{part:<8} {key:<9} {cells}")
    return "\n".join(head + rows)


def main(argv=None) -> int:
    return run_main(run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
