"""The language-model loss without the whole vocabulary's logits in memory.

Plain cross-entropy builds logits for every position of the micro-batch at once (tokens x
vocabulary x 4 bytes: 2.5 GB for 4k tokens of a 150k vocabulary), and autograd keeps them
for the backward pass. Here only positions that carry a label get logits at all, and they are
made a chunk at a time; each chunk's logits are recomputed in the backward pass instead of
kept (activation checkpointing of the head), so at most one chunk's logits exist at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CHUNK_BYTES = 64 * 1024**2  # fp32 logits of one chunk
# LinearCrossEntropy's one buffer: half the size costs no speed there (measured on the CPU,
# docs/performance.md), while the checkpointed chunks keep the size older runs resume with.
FUSED_CHUNK_BYTES = 32 * 1024**2
# ... but each chunk streams the whole head: at Qwen3.5's 248k x 1024 that was 33 positions a
# chunk and 2.1 s for 256 positions' loss and backward, against 1.1 s at 128 (docs/
# performance.md). The buffer may grow to an eighth of the head's own bytes, up to this.
FUSED_MAX_BYTES = 256 * 1024**2


def chunk_positions(vocab_size: int, fused: bool = False, hidden_dim: int = 0) -> int:
    """Positions a chunk of the loss: CHUNK_BYTES of fp32 logits for the checkpointed
    chunks; for the fused ones FUSED_CHUNK_BYTES, or an eighth of a large head's bytes."""
    if not fused:
        return max(1, CHUNK_BYTES // (4 * vocab_size))
    head = 4 * vocab_size * hidden_dim
    return max(1, max(FUSED_CHUNK_BYTES, min(FUSED_MAX_BYTES, head // 8)) // (4 * vocab_size))


def _chunk_loss(head: torch.nn.Module, hidden, targets, weights):
    logits = head(hidden).float()
    return (F.cross_entropy(logits, targets, reduction="none") * weights).sum()


def fusable(head: torch.nn.Module, hidden: torch.Tensor) -> bool:
    """LinearCrossEntropy serves a plain fp32 bias-free head outside autocast (the fp32 CPU
    and GPU runs); a 16-bit or autocast run keeps the checkpointed chunks."""
    return (
        type(head) is torch.nn.Linear
        and head.bias is None
        and hidden.dtype == head.weight.dtype == torch.float32
        and not torch.is_autocast_enabled(hidden.device.type)
    )


class LinearCrossEntropy(torch.autograd.Function):
    """sum_i w_i * cross_entropy(hidden_i @ W^T, t_i), a chunk of positions at a time, with the
    gradients made in the same pass: each chunk's logits become softmax - onehot in place and
    go straight into d hidden and d W. Neither the logits nor a recomputation of them is kept
    for the backward pass (the checkpointed chunks compute every logit twice); the backward
    only scales the stored gradients. w: each position's weight, already divided by the count."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, w, chunk: int):
        total = hidden.new_zeros((), dtype=torch.float32)
        d_hidden = torch.empty_like(hidden) if hidden.requires_grad else None
        d_weight = torch.zeros_like(weight) if weight.requires_grad else None
        # One logits buffer for every chunk: the softmax and its gradient are made in it in
        # place, so a chunk costs one (positions x vocabulary) block, allocated once.
        buf = hidden.new_empty(min(chunk, len(targets)), weight.shape[0])
        for start in range(0, len(targets), chunk):
            part = slice(start, start + chunk)
            h, t = hidden[part], targets[part]
            z = torch.mm(h, weight.t(), out=buf[: len(t)])
            z.sub_(z.amax(1, keepdim=True))
            picked = z.gather(1, t[:, None]).squeeze(1)
            grad = z.exp_()
            sums = grad.sum(1)
            total += ((sums.log() - picked) * w[part]).sum()
            grad.div_(sums[:, None])  # the softmax
            grad[torch.arange(len(t), device=t.device), t] -= 1
            grad.mul_(w[part, None])
            if d_hidden is not None:
                torch.mm(grad, weight, out=d_hidden[part])
            if d_weight is not None:
                d_weight.addmm_(grad.t(), h)
        ctx.save_for_backward(d_hidden, d_weight)
        return total

    @staticmethod
    def backward(ctx, g):
        d_hidden, d_weight = ctx.saved_tensors  # used once: scaled in place
        if d_hidden is not None:
            d_hidden = d_hidden.mul_(g)
        if d_weight is not None:
            d_weight = d_weight.mul_(g)
        return d_hidden, d_weight, None, None, None


def lm_loss(
    head, hidden: torch.Tensor, targets: torch.Tensor, mask=None, chunk=None, fused: bool = False
):
    """Mean cross-entropy of head(hidden) against targets over the positions whose mask is
    non-zero (all positions without a mask), weighted by the mask; equal, within fp32
    rounding, to F.cross_entropy over the whole logits. fused: LinearCrossEntropy where it
    serves (a fine-tune's model; a new model keeps the checkpointed chunks its older runs
    resume with bit for bit). A head given a linear_cross_entropy by a GPU's kernel set
    (core.models.kernels: Liger's fused kernel) computes the loss with it."""
    own = getattr(head, "linear_cross_entropy", None)
    if own is not None:
        return own(hidden, head.weight, targets, mask)
    hidden = hidden.reshape(-1, hidden.size(-1))
    targets = targets.reshape(-1)
    if mask is None:
        weights = torch.ones(targets.shape, device=hidden.device, dtype=torch.float32)
    else:
        weights = mask.reshape(-1).float()
        keep = weights.nonzero().squeeze(1)  # positions without a label get no logits
        hidden, targets, weights = hidden[keep], targets[keep], weights[keep]
    fused = fused and fusable(head, hidden)
    chunk = chunk or chunk_positions(head.weight.shape[0], fused, head.weight.shape[1])
    count = weights.sum().clamp(min=1) if mask is not None else weights.new_tensor(len(weights))
    if fused:
        return LinearCrossEntropy.apply(hidden, head.weight, targets, weights / count, chunk)
    if mask is None and len(targets) <= chunk:  # one chunk: exactly the plain mean
        return F.cross_entropy(head(hidden).float(), targets)
    if len(targets) <= chunk:
        return _chunk_loss(head, hidden, targets, weights) / count
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, len(targets), chunk):
        part = slice(start, start + chunk)
        total = total + checkpoint(
            _chunk_loss, head, hidden[part], targets[part], weights[part], use_reentrant=False
        )
    return total / count


def _chunk_logps(head: torch.nn.Module, hidden, targets, weights, rows, n_rows: int):
    logits = head(hidden).float()
    logps = -F.cross_entropy(logits, targets, reduction="none") * weights
    return logps.new_zeros(n_rows).index_add(0, rows, logps)


def sequence_logps(
    head, hidden: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, chunk=None
) -> torch.Tensor:
    """Each sequence's summed log-probability of its targets where mask is non-zero (B,):
    what preference tuning compares. Logits only at masked positions, a chunk at a time."""
    n_rows, t = targets.shape
    hidden = hidden.reshape(-1, hidden.size(-1))
    weights = mask.reshape(-1).float()
    keep = weights.nonzero().squeeze(1)
    hidden, targets, weights = hidden[keep], targets.reshape(-1)[keep], weights[keep]
    rows = torch.div(keep, t, rounding_mode="floor")
    chunk = chunk or chunk_positions(head.weight.shape[0])
    if len(targets) <= chunk:
        return _chunk_logps(head, hidden, targets, weights, rows, n_rows)
    total = hidden.new_zeros(n_rows, dtype=torch.float32)
    for start in range(0, len(targets), chunk):
        part = slice(start, start + chunk)
        total = total + checkpoint(
            _chunk_logps,
            head,
            hidden[part],
            targets[part],
            weights[part],
            rows[part],
            n_rows,
            use_reentrant=False,
        )
    return total


def _chunk_token_logps(head: torch.nn.Module, hidden, targets, temperature: float):
    logits = head(hidden).float() / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    logps = logp_all.gather(1, targets[:, None])[:, 0]
    with torch.no_grad():  # a logged signal: no gradient (as TRL's)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logps, entropy


class LinearTokenLogps(torch.autograd.Function):
    """(log p(t_i), entropy_i) of softmax(hidden_i @ W^T / temperature), a chunk of positions
    at a time in one reused buffer; only each position's log-sum-exp is kept. The backward
    makes each chunk's logits again (one matmul) and turns them into softmax - onehot in
    place: cheaper than a checkpoint's recomputation of the whole forward (entropy
    included) and its autograd. The entropy gets no gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk: int):
        n = len(targets)
        logps = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        buf = hidden.new_empty(min(chunk, n), weight.shape[0])
        spare = torch.empty_like(buf)
        for start in range(0, n, chunk):
            part = slice(start, start + chunk)
            h, t = hidden[part], targets[part]
            z = torch.mm(h, weight.t(), out=buf[: len(t)]).div_(temperature)
            top = z.amax(1, keepdim=True)
            z.sub_(top)
            e = torch.exp(z, out=spare[: len(t)])
            sums = e.sum(1)
            log_sums = sums.log()
            logps[part] = z.gather(1, t[:, None])[:, 0] - log_sums
            entropy[part] = log_sums - e.mul_(z).sum(1) / sums
            lse[part] = top[:, 0] + log_sums
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropy)
        return logps, entropy

    @staticmethod
    def backward(ctx, g, _g_entropy):
        hidden, weight, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        d_hidden = torch.empty_like(hidden) if need_h else None
        d_weight = torch.zeros_like(weight) if need_w else None
        buf = hidden.new_empty(min(ctx.chunk, len(targets)), weight.shape[0])
        for start in range(0, len(targets), ctx.chunk):
            part = slice(start, start + ctx.chunk)
            h, t = hidden[part], targets[part]
            # d logp_i / d z_i = (onehot - softmax) / temperature, times the upstream g_i
            grad = torch.mm(h, weight.t(), out=buf[: len(t)]).div_(ctx.temperature)
            grad.sub_(lse[part, None]).exp_().mul_(-g[part, None])
            grad[torch.arange(len(t), device=t.device), t] += g[part]
            grad.div_(ctx.temperature)
            if d_hidden is not None:
                torch.mm(grad, weight, out=d_hidden[part])
            if d_weight is not None:
                d_weight.addmm_(grad.t(), h)
        return d_hidden, d_weight, None, None, None


def token_logps(
    head,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    chunk=None,
    fused: bool = True,
):
    """Each target's log-probability under head(hidden) / temperature, and each position's
    entropy (no gradient), both (B, T) and 0 where mask is 0: what GRPO's loss reads. Logits
    only at masked positions, a chunk at a time, so at most one chunk's logits exist at
    once; equal, within fp32 rounding, to log_softmax over the whole logits. fused:
    LinearTokenLogps where it serves (a plain fp32 head), else checkpointed chunks."""
    shape = targets.shape
    hidden = hidden.reshape(-1, hidden.size(-1))
    keep = mask.reshape(-1).nonzero().squeeze(1)
    hidden, targets = hidden[keep], targets.reshape(-1)[keep]
    fused = fused and fusable(head, hidden) and len(targets) > 0
    chunk = chunk or chunk_positions(head.weight.shape[0], fused, head.weight.shape[1])
    if fused:
        parts = [LinearTokenLogps.apply(hidden, head.weight, targets, temperature, chunk)]
    elif len(targets) <= chunk:
        parts = [_chunk_token_logps(head, hidden, targets, temperature)]
    else:
        parts = [
            checkpoint(
                _chunk_token_logps,
                head,
                hidden[s : s + chunk],
                targets[s : s + chunk],
                temperature,
                use_reentrant=False,
            )
            for s in range(0, len(targets), chunk)
        ]
    out = []
    for values in zip(*parts, strict=True):
        values = torch.cat(values)
        full = values.new_zeros(shape.numel()).index_copy(0, keep, values)
        out.append(full.view(shape))
    return out[0], out[1]
