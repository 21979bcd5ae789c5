"""python -m core.generate RUN_DIR|CHECKPOINT|MODEL_FOLDER|HUB_ID --prompt TEXT.

--chat treats the prompt as a user message in the model's chat template and stops at its
end-of-turn token. Streams the prompt, then the continuation, to stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.cli.base import Parser, UsageError, non_negative, run_main
from core.config.fields import THINKING
from core.data.chat import set_thinking
from core.errors import EXIT_OK
from core.platform.device import resolve_device
from core.use.generate import check_images, generate_ids, seeing, start_ids, stream_text
from core.weights.loader import load

MAX_PROMPT_BYTES = 16 << 20  # far past any model's context


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m core.generate", description="Generate text with a model.")
    p.add_argument(
        "target", help="a run folder, a checkpoint file, a Hugging Face model folder or hub id"
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="the prompt is a user message: apply the model's chat template, stop at end of turn",
    )
    p.add_argument("--system", help="with --chat: a system message first")
    p.add_argument(
        "--thinking",
        choices=THINKING,
        help="with --chat: the template's thinking switch (enable_thinking) on or off, or "
        "default: the template's own (without the flag: the run's thinking setting)",
    )
    p.add_argument("--prompt", default=None, help="text to continue (default: a newline)")
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="an image the prompt shows (PNG, JPEG or WebP; may repeat): with --chat in the "
        "user's message before its text; a model with a vision tower (Gemma 3 4B and up, "
        "Gemma 4, Qwen3-VL, Qwen3.5)",
    )
    p.add_argument("--prompt-file", help="read the prompt from this file")
    p.add_argument("--max-new-tokens", type=non_negative(int), default=200, metavar="N")
    p.add_argument(
        "--temperature", type=non_negative(float), default=0.8, metavar="T", help="0: greedy"
    )
    p.add_argument("--top-k", type=non_negative(int), default=None, metavar="K")
    p.add_argument("--top-p", type=non_negative(float), default=None, metavar="P")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", choices=("best", "latest"), default="best")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole window each token")
    return p


def read_prompt(args) -> str:
    if args.prompt_file:
        path = Path(args.prompt_file)
        if not path.is_file():  # a folder, a pipe, /dev/zero: nothing to read whole
            raise UsageError(f"--prompt-file: {path} is not a file")
        if path.stat().st_size > MAX_PROMPT_BYTES:
            raise UsageError(
                f"--prompt-file: {path} holds {path.stat().st_size:,} bytes; a prompt is at "
                f"most {MAX_PROMPT_BYTES:,}"
            )
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--prompt-file: cannot read {args.prompt_file} ({e})") from None
    return args.prompt if args.prompt is not None else "\n"


def run_cli(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p: expected a number in (0, 1], got {args.top_p}")
    device = str(resolve_device(args.device))  # a missing GPU is a one-line error
    prompt = read_prompt(args)
    pictures = check_images(args.image)  # each decoded and checked before the model loads
    loaded = load(args.target, args.checkpoint, device)
    tok = loaded.tokenizer
    if args.thinking and args.chat:
        set_thinking(tok, args.thinking)
    out = sys.stdout
    shown = seeing(loaded, args.image, pictures) if args.image else None
    ids, stops, until = start_ids(tok, prompt, args.chat, args.system, seeing=shown)
    if not args.chat:
        out.write(prompt)
        out.flush()
    new = generate_ids(
        loaded.model,
        ids,
        args.max_new_tokens,
        args.temperature,
        args.top_k or None,
        args.top_p,
        args.seed,
        use_cache=not args.no_cache,
        stop_ids=stops,
        images=shown.pixels if shown else None,
    )
    for text in stream_text(tok, new, hide=stops, until=until):
        out.write(text)
        out.flush()
    out.write("\n")
    return EXIT_OK


def main(argv=None) -> int:
    return run_main(run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
