"""python -m core.export RUN_DIR|CHECKPOINT --format hf|gguf|safetensors|peft --out DIR"""

from __future__ import annotations

import sys

from core.cli.base import Parser, run_main
from core.errors import EXIT_OK
from core.use.export import FORMATS, export


def build_parser() -> Parser:
    p = Parser(prog="python -m core.export", description="Export a trained run.")
    p.add_argument("target", help="a run folder or a checkpoint file")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--out", required=True, help="a new (or empty) folder")
    p.add_argument("--checkpoint", choices=("best", "latest"), default="best")
    return p


def run_cli(argv=None) -> int:
    args = build_parser().parse_args(argv)
    out = export(args.target, args.format, args.out, args.checkpoint)
    print(f"Exported {args.format} to {out}")
    return EXIT_OK


def main(argv=None) -> int:
    return run_main(run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
