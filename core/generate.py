"""Use a model: python -m core.generate RUN_DIR|CHECKPOINT|MODEL_FOLDER|HUB_ID --prompt TEXT.

--chat treats the prompt as a user message in the model's chat template and stops at its
end-of-turn token.

Streams the prompt, then the continuation, to stdout. Deterministic for a given seed.
Generation keeps a key/value cache, so n new tokens cost O(n) forward work; past the
context length the window slides forward by half a context and the cache is rebuilt.
"""

from __future__ import annotations

import argparse
import codecs
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from .chat import chat_ids
from .device import resolve_device
from .errors import UserError
from .loader import Loaded, checkpoint_path, load  # noqa: F401 (the loader's API, here too)
from .model import GPT
from .tokenizer import Tokenizer

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


def pick(logits: torch.Tensor, temperature: float, top_k, top_p, gen: torch.Generator) -> int:
    """The next token from one row of logits: greedy at temperature 0, else sampled after
    top-k and nucleus (top-p) filtering."""
    logits = logits.float().cpu()
    if temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        order = torch.argsort(logits, descending=True)
        probs = torch.softmax(logits[order], dim=-1)
        drop = torch.cumsum(probs, dim=-1) - probs >= top_p  # keep the first token always
        logits[order[drop]] = float("-inf")
    return int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen))


def generate_ids(
    model: GPT,
    prompt: list[int],
    n_new: int,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    use_cache: bool = True,
    should_stop: Callable[[], bool] | None = None,
    stop_ids: list[int] | tuple = (),
) -> Iterator[int]:
    """Yield n_new token ids after prompt. The window over which the model looks is the same
    with and without the cache: once it is full it moves forward by half a context."""
    context = model.config.seq_len
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    tokens = list(prompt)
    start = max(0, len(tokens) - context)
    cache, cache_start = None, None
    for _ in range(n_new):
        if should_stop is not None and should_stop():
            return
        if len(tokens) - start > context:
            start = len(tokens) - context // 2
        window = tokens[start:]
        with torch.no_grad():
            if not use_cache:
                logits, _ = model(torch.tensor([window], device=device))
            elif cache is None or cache_start != start:
                logits, cache = model.forward_cached(torch.tensor([window], device=device), None)
                cache_start = start
            else:
                last = torch.tensor([[window[-1]]], device=device)
                logits, cache = model.forward_cached(last, cache, len(window) - 1)
        nxt = pick(logits[0, -1], temperature, top_k, top_p, gen)
        tokens.append(nxt)
        yield nxt
        if nxt in stop_ids:  # the end of an answer: yielded, so callers see why it stopped
            return


def stream_text(tokenizer: Tokenizer, ids: Iterator[int], hide=(), until=()) -> Iterator[str]:
    """Decoded text as it is produced; a character split across tokens waits for its end.
    Ids in hide (an end-of-turn token) are not shown. At a string of until (an end-of-turn
    mark spelled in text) the text ends, the mark not shown; text that may be the start
    of one waits until it is known not to be."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    held = ""
    for i in ids:
        if i in hide:
            continue
        held += decoder.decode(tokenizer.token_bytes(i))
        ends = [held.find(s) for s in until if s in held]
        if ends:
            if held[: min(ends)]:
                yield held[: min(ends)]
            return
        keep = max((k for s in until for k in range(1, len(s)) if held.endswith(s[:k])), default=0)
        if len(held) > keep:
            yield held[: len(held) - keep]
            held = held[len(held) - keep :]
    held += decoder.decode(b"", final=True)
    if held:
        yield held


# -- command line ---------------------------------------------------------------------------


class UsageError(UserError):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _non_negative(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m core.generate", description="Generate text with a model.")
    p.add_argument(
        "target", help="a run folder, a checkpoint file, a Hugging Face model folder or hub id"
    )
    p.add_argument(
        "--chat", action="store_true",
        help="the prompt is a user message: apply the model's chat template, stop at end of turn",
    )  # fmt: skip
    p.add_argument("--system", help="with --chat: a system message first")
    p.add_argument("--prompt", default=None, help="text to continue (default: a newline)")
    p.add_argument("--prompt-file", help="read the prompt from this file")
    p.add_argument("--max-new-tokens", type=_non_negative(int), default=200, metavar="N")
    p.add_argument(
        "--temperature", type=_non_negative(float), default=0.8, metavar="T", help="0: greedy"
    )
    p.add_argument("--top-k", type=_non_negative(int), default=None, metavar="K")
    p.add_argument("--top-p", type=_non_negative(float), default=None, metavar="P")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", choices=("best", "latest"), default="best")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole window each token")
    return p


def read_prompt(args) -> str:
    if args.prompt_file:
        try:
            return Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--prompt-file: cannot read {args.prompt_file} ({e})") from None
    return args.prompt if args.prompt is not None else "\n"


def prompt_ids(tok: Tokenizer, prompt: str) -> list[int]:
    """A plain prompt's ids, with BOS first where the model's tokenizer adds one."""
    ids = tok.encode(prompt) or tok.encode("\n")
    if tok.add_bos:
        ids = [tok.bos_id, *ids]
    return ids


def start_ids(
    tok: Tokenizer, prompt: str, chat: bool, system: str | None = None, history=()
) -> tuple[list[int], list[int], list[str]]:
    """(prompt ids, stop ids, stop strings): a plain prompt runs to the length asked; a chat
    prompt is a user message (after history, the conversation so far) in the model's
    template and ends at the model's end of turn."""
    if not chat:
        return prompt_ids(tok, prompt), [], []
    messages = [{"role": "system", "content": system}] if system else []
    messages += [*history, {"role": "user", "content": prompt}]
    return chat_ids(tok, messages), tok.stop_ids, tok.stop_strings


def run_cli(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p: expected a number in (0, 1], got {args.top_p}")
    device = str(resolve_device(args.device))  # a missing GPU is a one-line error
    prompt = read_prompt(args)
    loaded = load(args.target, args.checkpoint, device)
    tok = loaded.tokenizer
    out = sys.stdout
    ids, stops, until = start_ids(tok, prompt, args.chat, args.system)
    if not args.chat:
        out.write(prompt)
        out.flush()
    new = generate_ids(
        loaded.model, ids, args.max_new_tokens, args.temperature, args.top_k or None,
        args.top_p, args.seed, use_cache=not args.no_cache, stop_ids=stops,
    )  # fmt: skip
    for text in stream_text(tok, new, hide=stops, until=until):
        out.write(text)
        out.flush()
    out.write("\n")
    return EXIT_OK


def main(argv=None) -> int:
    try:
        return run_cli(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
