"""The Gated DeltaNet mixer of Qwen3.5's linear-attention layers (transformers'
Qwen3_5GatedDeltaNet): a short causal conv over q, k and v, decay and beta gates, the gated
delta rule, and an output gate through a gated RMSNorm.

The delta rule runs in chunks of 64 tokens in PyTorch (the same algorithm as transformers'
`torch_chunk_gated_delta_rule`, on the CPU and in CI), and one token at a time from a state
for generation. On CUDA, where flash-linear-attention (`fla`, the `fla` extra) imports, its
kernels run the rule instead; the torch path is the reference and the fallback.

The four input projections (transformers' in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) are
one Linear, `qkv`, and the output projection is `proj`, so LoRA's "attn" targets, the 4-bit
base and the weight tables treat it as they treat attention. A layer's state for generation
is (conv state (B, conv channels, kernel - 1), recurrent state (B, v heads, k dim, v dim)).
"""

from __future__ import annotations

import importlib

import torch
import torch.nn as nn
import torch.nn.functional as F

CHUNK = 64  # tokens a chunk of the delta rule, as transformers' and fla's
KEYS = ("n_k_heads", "n_v_heads", "k_head_dim", "v_head_dim", "conv_kernel")
KERNEL_DEVICES = ("cuda",)  # where fla's kernels run (a test adds "cpu" with a stand-in)
FLA_MISSING = (
    "linear-attention layers run on the torch path: flash-linear-attention is not installed "
    "(pip install 'traindeck[fla]'); its CUDA kernels are several times faster per layer"
)


def options(linear: dict) -> dict:
    """GPTConfig.linear_attn checked; ValueError names a missing or unknown key."""
    missing = [k for k in KEYS if k not in linear]
    unknown = sorted(set(linear) - set(KEYS))
    if missing or unknown:
        what = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}"
        raise ValueError(f"linear_attn: {what}; its keys: {', '.join(KEYS)}")
    if linear["n_v_heads"] % linear["n_k_heads"]:
        raise ValueError("linear_attn: n_v_heads must be a multiple of n_k_heads")
    return dict(linear)


def in_sizes(linear: dict) -> list[int]:
    """The fused input projection's parts: q k v (the conv's channels), z, b, a."""
    k_dim = linear["n_k_heads"] * linear["k_head_dim"]
    v_dim = linear["n_v_heads"] * linear["v_head_dim"]
    heads = linear["n_v_heads"]
    return [2 * k_dim + v_dim, v_dim, heads, heads]


def saved_bytes(linear: dict, act_bytes: int) -> int:
    """Bytes a DeltaNet layer keeps a token for the backward pass (the estimate's): the
    projections and conv in the activations' type; in fp32 q and k (repeated to the v
    heads, before and after their norm), v, the solve's parts, a chunk's three C x C
    matrices (C a token) and the state kept each chunk; the gated norm's inputs."""
    heads, dk, dv = linear["n_v_heads"], linear["k_head_dim"], linear["v_head_dim"]
    channels, v_dim = in_sizes(linear)[:2]
    typed = act_bytes * (3 * channels + 3 * v_dim)
    rule = 4 * heads * (8 * dk + 5 * dv + 3 * CHUNK + dk * dv // CHUNK)
    return typed + rule


def state_bytes(linear: dict, act_bytes: int) -> int:
    """A row's generation state in one layer: the fp32 recurrent state and the conv's."""
    heads, dk, dv = linear["n_v_heads"], linear["k_head_dim"], linear["v_head_dim"]
    return 4 * heads * dk * dv + act_bytes * in_sizes(linear)[0] * (linear["conv_kernel"] - 1)


def kernel_line(c, device: torch.device) -> str | None:
    """The one line a model with DeltaNet layers gets on CUDA without fla (else None)."""
    if not c.linear_attn or device.type not in KERNEL_DEVICES or fla_kernels(device):
        return None
    return FLA_MISSING


def fla_kernels(device: torch.device):
    """fla's (chunk, fused_recurrent) gated delta rule where they run, else None."""
    if device.type not in KERNEL_DEVICES:
        return None
    try:
        ops = importlib.import_module("fla.ops.gated_delta_rule")
    except ImportError:
        return None
    return ops.chunk_gated_delta_rule, ops.fused_recurrent_gated_delta_rule


class GatedRMSNorm(nn.Module):
    """RMSNorm over each value head, then times silu(z), in fp32 (transformers' RMSNormGated)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x, z):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(x.dtype)
        return (h * F.silu(z.float())).to(x.dtype)


def l2norm(x, eps: float = 1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


# Decays under e^-20 (2e-9) are taken as exact zeros. Beside the chunk's own O(1) terms they
# fall under fp32's rounding, and kept, their products sink to denormal floats, which x86's
# matrix kernels (MKL's threads ignore torch.set_flush_denormal) run about 100x slower: a
# Qwen3.5 DeltaNet layer's forward + backward took 157 ms with them, 85 without
# (docs/performance.md). Three such factors still multiply to a normal float (8e-27).
DECAY_FLOOR = -20.0


def _decay(log_decay):
    """exp of a log-decay (<= 0), with those under DECAY_FLOOR as exact zeros."""
    return log_decay.masked_fill(log_decay < DECAY_FLOOR, float("-inf")).exp()


def chunk_delta_rule(q, k, v, g, beta, state=None, chunk: int = CHUNK):
    """The gated delta rule over (B, H, T, .) fp32 q, k (normed, q scaled), v and the gates
    g (log decay), beta (B, H, T), in chunks: within a chunk the updates are one triangular
    solve (the WY form), across chunks a loop carries the state. Returns (out, state)."""
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    pad = -t % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // chunk
    q, k, v = (x.reshape(b, h, n, chunk, -1) for x in (q, k, v))
    g, beta = g.reshape(b, h, n, chunk), beta.reshape(b, h, n, chunk)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = g.cumsum(-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = _decay((cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")))
    system = (k_beta @ k.transpose(-1, -2)) * decay  # its diagonal is taken as 1
    rhs = torch.cat((v_beta, k_beta * _decay(cum)[..., None]), -1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u, w = solved.split((dv, dk), -1)
    inner = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * _decay(cum)[..., None]
    k_decayed = k * _decay(cum[..., -1:] - cum)[..., None]
    last = _decay(cum[..., -1])[..., None, None]
    s = q.new_zeros(b, h, dk, dv) if state is None else state.float()
    outs = []
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ s
        outs.append(q_decayed[:, :, i] @ s + inner[:, :, i] @ v_new)
        s = s * last[:, :, i] + k_decayed[:, :, i].transpose(-1, -2) @ v_new
    return torch.stack(outs, 2).reshape(b, h, -1, dv)[:, :, :t], s


def recurrent_delta_rule(q, k, v, g, beta, state=None):
    """The same rule a token at a time (generation's few new tokens)."""
    b, h, t, dk = k.shape
    s = q.new_zeros(b, h, dk, v.shape[-1]) if state is None else state.float()
    outs = []
    for i in range(t):
        s = s * g[:, :, i].exp()[..., None, None]
        seen = torch.einsum("bhk,bhkv->bhv", k[:, :, i], s)
        delta = (v[:, :, i] - seen) * beta[:, :, i, None]
        s = s + k[:, :, i, :, None] * delta[:, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, i], s))
    return torch.stack(outs, 2), s


class GatedDeltaNet(nn.Module):
    def __init__(self, c):
        """c: the model's GPTConfig (core.models.model imports this module)."""
        super().__init__()
        o = options(c.linear_attn)
        self.n_k, self.n_v = o["n_k_heads"], o["n_v_heads"]
        self.dk, self.dv, self.kernel = o["k_head_dim"], o["v_head_dim"], o["conv_kernel"]
        self.sizes = in_sizes(o)
        self.window = None  # no attention mask of its own (GPT.forward_cached asks)
        self.qkv = nn.Linear(c.hidden_dim, sum(self.sizes), bias=False)
        channels = self.sizes[0]
        self.conv = nn.Parameter(torch.empty(channels, 1, self.kernel))  # depthwise, no bias
        nn.init.kaiming_uniform_(self.conv, a=5**0.5)
        self.dt_bias = nn.Parameter(torch.ones(self.n_v))
        self.A_log = nn.Parameter(torch.empty(self.n_v).uniform_(0.01, 16).log())
        self.norm = GatedRMSNorm(self.dv, c.norm_eps)
        self.proj = nn.Linear(self.n_v * self.dv, c.hidden_dim, bias=False)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x, rope=None, starts=None, side=None):
        """x (B, T, C); starts (B, T): True where a packed example begins (None: one a row),
        each example run from a fresh state as it would alone. rope: unused (no positions)."""
        if starts is None or not bool(starts[:, 1:].any()):
            y, _ = self.mix(x)
            return self.drop(y)
        row, pos, rows, length = _examples(starts)
        y, _ = self.mix(_gather(x, row, pos, rows, length))
        return self.drop(_scatter(y, row, pos, x.shape))

    def cached(self, x, past, rope=None, valid=None, side=None):
        """forward() for generation: from past (conv state, recurrent state) or zeros;
        valid (B, T): False over padding, which leaves the state as it was. Returns
        (y, (conv state, recurrent state))."""
        if valid is None or bool(valid.all()):
            return self.mix(x, past, keep=True)
        b, t = valid.shape
        lengths = valid.sum(1)
        pos = valid.long().cumsum(1) - 1
        row = torch.arange(b, device=x.device)[:, None].expand(b, t)
        row, pos = row[valid], pos[valid]
        y, state = self.mix(_gather(x[valid], row, pos, b, t), past, lengths, keep=True)
        out = x.new_zeros(x.shape)
        out[valid] = y[row, pos]
        return out, state

    def mix(self, x, past=None, lengths=None, keep: bool = False):
        """The layer over rows (B, T, C) of tokens from their start; lengths (B,): the tokens
        of each row (the rest is padding at its end), None: all. keep: return the state."""
        b, t, _ = x.shape
        mixed, z, beta, a = self.qkv(x).split(self.sizes, -1)
        conv_state = None if past is None else past[0]
        mixed, conv_state = self._conv(mixed.transpose(1, 2), conv_state, lengths, keep)
        q, k, v = mixed.transpose(1, 2).split(self._qkv_sizes(), -1)
        q = q.reshape(b, t, self.n_k, self.dk)
        k = k.reshape(b, t, self.n_k, self.dk)
        v = v.reshape(b, t, self.n_v, self.dv)
        beta = beta.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        if lengths is not None:  # padding: no decay, no update
            on = (torch.arange(t, device=x.device)[None, :] < lengths[:, None])[..., None]
            g, beta = g * on, beta * on
        state = None if past is None else past[1]
        out, state = self.rule(q, k, v, g, beta, state)
        out = self.norm(out, z.reshape(b, t, self.n_v, self.dv))
        y = self.proj(out.reshape(b, t, -1))
        return y, ((conv_state, state) if keep else None)

    def _qkv_sizes(self) -> list[int]:
        k_dim = self.n_k * self.dk
        return [k_dim, k_dim, self.n_v * self.dv]

    def _conv(self, mixed, state, lengths, keep: bool):
        """The causal depthwise conv and silu over (B, C, T), after state's kernel - 1
        columns (None: zeros); and the new state, the last kernel - 1 columns of each row's
        tokens."""
        b, c, t = mixed.shape
        if state is None:
            state = mixed.new_zeros(b, c, self.kernel - 1)
        seq = torch.cat((state.to(mixed.dtype), mixed), -1)
        out = F.silu(F.conv1d(seq, self.conv.to(mixed.dtype), groups=c))
        if not keep:
            return out, None
        if lengths is None:
            return out, seq[:, :, t:]
        index = lengths[:, None] + torch.arange(self.kernel - 1, device=seq.device)
        return out, seq.gather(2, index[:, None, :].expand(b, c, -1))

    def rule(self, q, k, v, g, beta, state):
        """The delta rule over (B, T, heads, dim) q, k, v and (B, T, v heads) g, beta:
        fla's kernels where they run, else torch. Returns ((B, T, v heads, dv), state)."""
        dtype = v.dtype
        repeat = self.n_v // self.n_k
        if repeat > 1:  # each q/k head serves consecutive v heads
            q, k = q.repeat_interleave(repeat, 2), k.repeat_interleave(repeat, 2)
        kernels = fla_kernels(q.device)
        if kernels is not None:
            run = kernels[1] if q.shape[1] == 1 and state is not None else kernels[0]
            out, state = run(
                q,
                k,
                v,
                g=g,
                beta=beta,
                scale=self.dk**-0.5,
                initial_state=state,
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )
            return out.to(dtype), state
        q, k, v, g, beta = (x.transpose(1, 2).float() for x in (q, k, v, g, beta))
        q, k = l2norm(q) * self.dk**-0.5, l2norm(k)
        if q.shape[2] == 1 and state is not None:
            out, state = recurrent_delta_rule(q, k, v, g, beta, state)
        else:
            out, state = chunk_delta_rule(q, k, v, g, beta, state)
        return out.transpose(1, 2).to(dtype), state


def _examples(starts):
    """Where each token of packed rows goes among the examples as rows of their own:
    (row (B, T), position (B, T), rows, longest)."""
    b, t = starts.shape
    starts = starts.clone()
    starts[:, 0] = True
    row = starts.flatten().long().cumsum(0).reshape(b, t) - 1
    index = torch.arange(t, device=starts.device).expand(b, t)
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(1).values
    pos = index - first
    return row, pos, int(row.max()) + 1, int(pos.max()) + 1


def _gather(x, row, pos, rows: int, length: int):
    """x's tokens (B, T, C) or (N, C) placed at (row, pos) of (rows, length, C), zeros after."""
    out = x.new_zeros(rows, length, x.shape[-1])
    return out.index_put((row.flatten(), pos.flatten()), x.reshape(-1, x.shape[-1]))


def _scatter(y, row, pos, shape):
    return y[row.flatten(), pos.flatten()].reshape(shape)
