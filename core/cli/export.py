"""python -m core.export RUN_DIR|CHECKPOINT|MODEL_FOLDER --format FORMAT --out DIR
[--quant TYPE] [--system TEXT] [--ollama-create NAME]"""

from __future__ import annotations

import shutil
import sys

from core.cli.base import Parser, UsageError, run_main
from core.errors import EXIT_OK
from core.use.export import FORMATS, export
from core.use.gguf_quants import QUANTS
from core.use.ollama_export import ollama_create


def build_parser() -> Parser:
    p = Parser(prog="python -m core.export", description="Export a trained run or model.")
    p.add_argument("target", help="a run folder, a checkpoint file or a model folder")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--out", required=True, help="a new (or empty) folder")
    p.add_argument("--checkpoint", choices=("best", "latest"), default="best")
    p.add_argument(
        "--quant",
        metavar="TYPE",
        help=f"gguf and ollama: {' | '.join(QUANTS)} (default f16); q4_k_m and q5_k_m keep "
        "llama.cpp's mix (Q6_K for the output and half the attn_v/ffn_down layers)",
    )
    p.add_argument("--system", help="ollama: the Modelfile's SYSTEM prompt")
    p.add_argument(
        "--ollama-create",
        metavar="NAME",
        help="ollama: run `ollama create NAME` on the exported folder (ollama must be on PATH)",
    )
    return p


def run_cli(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.system is not None and args.format != "ollama":
        raise UsageError("--system: only the ollama format has a system prompt")
    if args.ollama_create:
        if args.format != "ollama":
            raise UsageError("--ollama-create: needs --format ollama")
        if shutil.which("ollama") is None:
            raise UsageError(
                "--ollama-create: ollama is not on PATH; install it from ollama.com, or export "
                "without it and run the printed ollama create command later"
            )
    out = export(args.target, args.format, args.out, args.checkpoint, args.quant, args.system)
    print(f"Exported {args.format} to {out}")
    if args.format == "ollama":
        if args.ollama_create:
            print(ollama_create(args.ollama_create, out) or f"ollama create {args.ollama_create}")
        else:
            print(f"Import it into Ollama with: ollama create NAME -f {out / 'Modelfile'}")
    return EXIT_OK


def main(argv=None) -> int:
    return run_main(run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
