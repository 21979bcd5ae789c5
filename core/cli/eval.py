"""python -m core.eval RUN|CHECKPOINT|MODEL_FOLDER|HUB_ID [--text FILE] [--choices FILE]
[--report [N]]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from core.cli.base import Parser, UsageError, non_negative, run_main
from core.errors import EXIT_OK
from core.use import evaluate, report


def build_parser() -> Parser:
    p = Parser(
        prog="python -m core.eval",
        description="Evaluate a model on text or questions; show a chat fine-tune's answers "
        "before and after.",
    )
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
    p.add_argument(
        "--report", type=non_negative(int), nargs="?", const=report.DEFAULT_EXAMPLES,
        metavar="N",
        help="a chat fine-tune: its first N (default 5) held-out prompts answered by the start "
        "model and the fine-tuned one, side by side in RUN/eval/report.md",
    )  # fmt: skip
    p.add_argument(
        "--max-new-tokens", type=non_negative(int), default=report.DEFAULT_NEW_TOKENS,
        metavar="N", help="with --report: the longest answer, in tokens",
    )  # fmt: skip
    p.add_argument("--checkpoint", choices=("best", "latest"), default="best")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def run_cli(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.text and not args.choices and args.report is None:
        raise UsageError("give --text FILE, --choices FILE or both, or --report")
    if args.report == 0:
        raise UsageError("--report: N must be at least 1")
    for name in ("text", "choices"):
        path = getattr(args, name)
        if path and not Path(path).is_file():
            raise UsageError(f"--{name}: {path} not found")
    bar = tqdm(unit="step", file=sys.stderr, disable=not sys.stderr.isatty())
    out = {}
    if args.text or args.choices:
        out = evaluate.evaluate_files(
            args.target, args.text, args.choices, args.fewshot, args.limit, args.compare,
            args.checkpoint, bar.update,
        )  # fmt: skip
    made = None
    if args.report is not None:
        made = report.make_report(
            args.target, args.report, args.max_new_tokens, args.checkpoint, bar.update
        )
        out["report"] = {"path": made["path"], "examples": made["examples"]}
    bar.close()
    if args.json:
        print(json.dumps(out))
        return EXIT_OK
    if args.text or args.choices:
        print(evaluate.format_table(out))
    if made:
        print(made["path"])
    return EXIT_OK


def main(argv=None) -> int:
    return run_main(run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
