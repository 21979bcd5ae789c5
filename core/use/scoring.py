"""The requests lm-evaluation-harness makes of a model, answered by a TrainDeck model with the
harness's own definitions (lm_eval 0.4.13, models/huggingface.py and api/model.py), so numbers
computed here equal the harness's:

- tokens: the tokenizer's default special tokens (BOS where it adds one, add_bos_token=None),
  none for a text that already starts with the prefix token's text (a rendered chat);
- a (context, continuation) pair: trailing spaces of the context move into the continuation,
  context + continuation is encoded whole and the continuation is its tokens past the
  context's (_encode_pair); an empty context is the prefix token (BOS, else EOS);
- rolling log-likelihood: windows of the model's context, the first starting with the prefix
  token, each later one conditioned on one token before it, the last one left-filled with
  earlier tokens (get_rolling_token_windows(context_len=1) and make_disjoint_window);
- generate_until: greedy, cut at the first stop string, special tokens left out of the text.

lm_eval itself is not needed here; core.use.harness puts these behind its LM interface.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from core.errors import DataError
from core.weights.loader import Loaded

# logits held at once while scoring a batch (elements; 2^27 fp32 = 512 MiB)
LOGIT_BUDGET = 1 << 27
ROLLING_CHUNK = 256  # windows of a long document scored at once


def prefix_token_id(tok) -> int:
    """The token an empty context and the first rolling window start from: BOS, else EOS."""
    if tok.bos_id is not None:
        return tok.bos_id
    if tok.eos_id is not None:
        return tok.eos_id
    return 0  # a byte or BPE tokenizer of our own has neither: byte 0 stands in


def token_text(tok, i: int) -> str:
    return tok.decode([i])


def tok_encode(tok, text: str, special: bool | None = None) -> list[int]:
    """lm_eval's tok_encode: the tokenizer's default special tokens unless told, and none for a
    text that already begins with the prefix token's text."""
    if special is None:
        special = not text.startswith(token_text(tok, prefix_token_id(tok)))
    if tok.kind == "model":
        return tok.hf.encode(text, add_special_tokens=special).ids
    ids = tok.encode(text)
    return [tok.bos_id, *ids] if special and tok.add_bos and tok.bos_id is not None else ids


def tok_decode(tok, ids: list[int]) -> str:
    """Generated text as the harness decodes it: special tokens left out."""
    if tok.kind == "model":
        return tok.hf.decode([int(i) for i in ids], skip_special_tokens=True)
    return tok.decode(ids)


def encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context tokens, continuation tokens) as the harness splits them (_encode_pair, and an
    empty context as the prefix token)."""
    if context == "":
        cont = tok_encode(tok, continuation, special=False)
        prefix = prefix_token_id(tok)
        return ([prefix], cont) if not cont or cont[0] != prefix else (cont[:1], cont[1:])
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok_encode(tok, context + continuation)
    ctx = tok_encode(tok, context)
    return ctx, whole[len(ctx) :]


def max_length(loaded: Loaded) -> int:
    return loaded.model.config.seq_len


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def loglikelihood_tokens(
    loaded: Loaded,
    pairs: list[tuple[list[int], list[int]]],
    progress: Callable[[int], None] | None = None,
    images: list | None = None,
) -> list[tuple[float, bool]]:
    """(sum of log p(continuation | context), whether every continuation token is the
    argmax) per (context tokens, continuation tokens), the input cut from the left to the
    model's context plus one, as the harness does. Longest first, right-padded batches (a
    causal model's earlier positions do not see the padding)."""
    model = loaded.model.eval()
    n, device = max_length(loaded), _device(model)
    vocab = model.config.vocab_size
    inputs = []
    for ctx, cont in pairs:
        if not cont:
            raise ValueError("a continuation with no tokens cannot be scored")
        inputs.append((ctx + cont)[-(n + 1) :][:-1])
    order = sorted(range(len(pairs)), key=lambda i: (-len(inputs[i]) - 1, inputs[i]))
    out: list[tuple[float, bool] | None] = [None] * len(pairs)
    start = 0
    while start < len(order):
        longest = len(inputs[order[start]])
        size = max(1, min(64, LOGIT_BUDGET // max(1, longest * vocab)))
        batch = order[start : start + size]
        rows = [inputs[i] + [0] * (longest - len(inputs[i])) for i in batch]
        ids = torch.tensor(rows, device=device)
        logits = model.logits(ids, **_seen(model, ids, batch, images))
        for row, i in enumerate(batch):
            cont = pairs[i][1]
            end = len(inputs[i])
            logp = F.log_softmax(logits[row, end - len(cont) : end].float(), -1)
            target = torch.tensor(cont, device=logp.device)
            ll = float(logp.gather(1, target[:, None]).sum())
            out[i] = (ll, bool((logp.argmax(-1) == target).all()))
        if progress:
            progress(len(batch))
        start += size
    return out  # type: ignore[return-value]


def _seen(model, ids: torch.Tensor, batch: list[int], images: list | None) -> dict:
    """The forward's images= for a batch of requests: the images of those that show one, in
    row order; a context cut to the model's through an image's tokens is refused."""
    shown = [images[i] for i in batch if images is not None and images[i] is not None]
    if not shown:
        return {}
    o = model.vision.options
    if int((ids == o.token_id).sum()) != len(shown) * o.tokens:
        raise DataError(
            "--choices: a question with an image is longer than the model's context "
            f"({max_length_of(model)} tokens): its image would be cut; shorten it"
        )
    return {"images": torch.cat(shown).to(_device(model))}


def max_length_of(model) -> int:
    return model.config.seq_len


def loglikelihood(loaded: Loaded, requests: list[tuple[str, str]], progress=None, images=None):
    """lm_eval's loglikelihood: (log-likelihood, is greedy) per (context, continuation).
    images: per request, the pixel values (1, 3, H, W) of the image its context shows (its
    tokens in the context already), or None."""
    pairs = [encode_pair(loaded.tokenizer, c, x) for c, x in requests]
    return loglikelihood_tokens(loaded, pairs, progress, images)


def rolling_windows(tokens: list[int], prefix: int, max_len: int) -> list[tuple[list, list]]:
    """get_rolling_token_windows(context_len=1) made disjoint: (context, scored tokens)."""
    if not tokens:
        return []
    first = min(max_len, len(tokens))
    windows = [([prefix] + tokens[: first - 1], tokens[:first])]
    done = first
    while done < len(tokens):
        width = min(len(tokens) - done, max_len)
        end = done + width
        windows.append((tokens[max(0, end - max_len - 1) : end - 1], tokens[end - width : end]))
        done += width
    return [(ctx[: len(ctx) - (len(cont) - 1)], cont) for ctx, cont in windows]


def loglikelihood_rolling(loaded: Loaded, texts: list[str], progress=None) -> list[dict]:
    """Per text: {"ll": the log-likelihood of all its tokens, "tokens": how many}."""
    tok, n = loaded.tokenizer, max_length(loaded)
    out = [{"ll": 0.0, "tokens": 0} for _ in texts]
    windows, owner = [], []  # a few hundred windows at a time, short documents batched

    def flush():
        for k, (x, _) in zip(owner, loglikelihood_tokens(loaded, windows, progress), strict=True):
            out[k]["ll"] += x  # window by window, in order, as lm_eval sums them
        windows.clear()
        owner.clear()

    for k, text in enumerate(texts):
        ids = tok_encode(tok, text)
        out[k]["tokens"] = len(ids)
        for pair in rolling_windows(ids, prefix_token_id(tok), n):
            windows.append(pair)
            owner.append(k)
            if len(windows) >= ROLLING_CHUNK:
                flush()
    if windows:
        flush()
    return out


def generate_until(
    loaded: Loaded, context: str, until: list[str] | str | None = None, max_gen_toks: int = 256
) -> str:
    """Greedy text after context, with TrainDeck's KV-cache generation, up to the first stop
    string (until plus the EOS token's text), as the harness's generate_until returns it."""
    from core.use.generate import generate_ids

    tok = loaded.tokenizer
    until = [until] if isinstance(until, str) else list(until or [])
    if tok.eos_id is not None:
        eos = tok.decode([tok.eos_id])
        if eos not in until:
            until.append(eos)
    keep = max_length(loaded) - max_gen_toks
    if keep <= 0:
        raise ValueError(f"max_gen_toks {max_gen_toks} leaves no room in the context")
    ids = tok_encode(tok, context)[-keep:]
    out: list[int] = []
    for i in generate_ids(loaded.model, ids, max_gen_toks, temperature=0.0, stop_ids=tok.stop_ids):
        out.append(i)
        text = tok_decode(tok, out)
        if any(s and s in text for s in until):
            break
    text = tok_decode(tok, out)
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text


def render_chat(loaded: Loaded, messages: list[dict]) -> str:
    """The model's chat template with the generation prompt (apply_chat_template); a template
    that refuses a system message gets none, as lm_eval retries."""
    from core.data import chat

    tok = loaded.tokenizer
    if not tok.chat_template:
        raise DataError("--chat: this model has no chat template")
    try:
        return chat.render(tok.chat_template, messages, True, **chat.render_vars(tok))
    except chat.TemplateError:
        rest = [m for m in messages if m["role"] != "system"]
        return chat.render(tok.chat_template, rest, True, **chat.render_vars(tok))
