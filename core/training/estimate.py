"""Predict a config's peak device memory: the memory model. What to run with, from it (the
longest context, the fit ladder, the recommended preset, the C heap): core.training.planner.

The activation model counts what autograd saves per token per layer for this GPT
(see the comments in `_layer_bytes`); the totals are printed as a breakdown.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from core.config import methods, recipe
from core.config.spec import TrainConfig
from core.models.deltanet import saved_bytes
from core.models.loss import chunk_positions
from core.models.model import GPTConfig, linear_layers
from core.models.moe import is_sparse, options, widths
from core.models.offload import offloads
from core.models.params import (
    active_params,
    adapted_weights,
    adapter_count,
    counted,
    expert_params,
    meta_model,
    shape_key,
    shape_params,
)
from core.models.per_layer import kv_source, kv_sources, layer_shape, table_params, varies
from core.models.per_layer import of as per_layer_of
from core.models.tiling import ATTN_CHUNK_QUERIES, MLP_TILE_TOKENS, tiles_at
from core.platform import compiling
from core.platform.device import pick_precision
from core.training import memory_profile as mp
from core.training import objectives

GB = 1024**3
MB = 1024**2
# CUDA's context, cuBLAS/cuDNN workspaces and loaded kernels: NVML's used less the allocator's
# reserved, 1,183-1,191 MiB over 11 runs on an H100 80GB HBM3 (132 SMs; driver 580.159, torch
# 2.11 + CUDA 13.0; docs/gpu.md). A card with fewer SMs needs less: the estimate errs safe.
CUDA_CONTEXT_BYTES = 1184 * MB
FRAGMENTATION = 1.10  # caching-allocator slack on top of the live peak
# glibc's heap on the CPU: freed blocks it keeps but cannot reuse for the next tensors
# (measured over 20 shapes, new models and fine-tunes: docs/performance.md)
CPU_FRAGMENTATION = 1.06
SAFETY_MARGIN = 0.10  # keep 10% of free VRAM unused when recommending
CPU_SCORE_BYTES = 13  # an attention score's bytes in the CPU math kernel (with dropout)
# Gemma 2's soft-capped attention (no fused kernel does it) keeps tanh's and softmax's fp32
# outputs and the causal mask for the backward pass: 8.25 bytes a score in fp32, measured with
# saved_tensors_hooks on core.models.model.explicit_attention. gpt-oss's sinks take the same
# path (scores, the sink column, softmax): counted alike, not measured apart.
SOFTCAP_SCORE_BYTES = 8.25
# What the first training step adds to a CPU process for good (kernels, thread pools and
# allocator arenas loaded on first use): 45-80 MiB measured before and after a warm-up step
# over seven shapes (docs/performance.md, "Estimate at long context").
CPU_RUNTIME_BYTES = 64 * MB
CPU_EXTRA_BLOCK = 1  # a block the CPU's backward holds beyond one (checkpointing; fused)
COUNTING_SEQ = 256  # the context parameters are counted at (_counting_shape)


def model_shape(cfg: TrainConfig) -> GPTConfig:
    """The network a config trains: its own shape, or its pretrained model's."""
    if cfg.init_from:
        from core.weights.loader import pretrained_shape

        return pretrained_shape(cfg.init_from)
    return GPTConfig.from_train(cfg)


def hidden_matrix_params(c: GPTConfig) -> int:
    """Weights Muon trains (the blocks' matrices): one fp32 momentum each, not AdamW's two."""

    def count():
        from core.training.optim import muon_params

        model = meta_model(c)
        hidden = muon_params(model)
        return sum(p.numel() for p in model.parameters() if id(p) in hidden)

    return counted(shape_key(c, "hidden"), count)


def _position_params(c: GPTConfig) -> int:
    return c.seq_len * c.hidden_dim if c.positions == "learned" else 0


def _counting_shape(c: GPTConfig) -> GPTConfig:
    """c at one fixed context: counts are cached by shape, and only learned positions depend
    on the context (the planner's longest_context probes many)."""
    return dataclasses.replace(c, seq_len=COUNTING_SEQ)


def _params(c: GPTConfig) -> int:
    fixed = _counting_shape(c)
    return shape_params(fixed) - _position_params(fixed) + _position_params(c)


def flops_per_token(cfg: TrainConfig, c: GPTConfig | None = None) -> int:
    """Training FLOPs per token (forward + backward): 6N + 12 L d T, as in nanoGPT/PaLM; N
    counts the parameters a token passes through (an MoE model's active ones)."""
    c = c or model_shape(cfg)
    n = active_params(c) - _position_params(c) - table_params(c)  # lookups, not products
    heads = sum(layer_shape(c, i).head_dim for i in range(c.n_layers)) if varies(c) else None
    heads = heads or c.n_layers * c.head_dim  # Gemma 4: full layers' heads are wider
    return 6 * n + 12 * c.n_heads * heads * cfg.seq_len


def _token_ffn(c: GPTConfig) -> int:
    """The MLP width a token goes through, on average over the layers: an MoE layer's top_k
    experts and the dense width beside them (core.models.moe.widths), a dense layer's ffn_dim."""
    if not c.moe:
        return c.ffn_dim
    sparse = sum(is_sparse(c, i) for i in range(c.n_layers))
    moe_width = sum(widths(c))
    return (sparse * moe_width + (c.n_layers - sparse) * c.ffn_dim) // c.n_layers


def _act_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


@dataclass(frozen=True)
class BlockRun:
    """How the blocks run, as far as what they keep for the backward pass depends on it."""

    dropout: float
    precision: str
    # a fine-tune's model (core.models.fused), which remakes the norms' and SwiGLU's outputs
    # in backward
    fused: bool = False
    lora: str = ""  # its LoRA targets, whose inputs the adapters keep for their gradients
    tiled: bool = False  # the MLP in checkpointed tiles (core.models.tiling): their input kept
    # False: a new model's block counted as the CPU's profile shows it (a GPU keeps the
    # constants it was measured with until a GPU measures it again)
    on_gpu: bool = True


def _saved_bytes_per_token_layer(c: GPTConfig, run: BlockRun) -> float:
    """_layer_bytes of a block, or their mean over the layers where those differ in shape
    (Gemma 4: full layers' own head size, layers that reuse keys and values keep none)."""
    if not varies(c):
        return _layer_bytes(c, run)
    total = 0.0
    for i in range(c.n_layers):
        total += _layer_bytes(layer_shape(c, i), run, own_kv=kv_source(c, i) is None)
    return total / c.n_layers


def _layer_bytes(c: GPTConfig, run: BlockRun, own_kv: bool = True) -> float:
    """Bytes autograd keeps per token per block for the backward pass, run as `run` says."""
    dropout, precision, fused, lora = run.dropout, run.precision, run.fused, run.lora
    tiled, on_gpu = run.tiled, run.on_gpu
    d, e = c.hidden_dim, _act_bytes(precision)
    q, kv, ffn = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, _token_ffn(c)
    fp32_residual = 2 * 4 * d  # norm inputs: the residual stream stays fp32 under autocast
    matmul_inputs = e * (d + q + ffn)  # qkv, attn proj and mlp fc inputs
    kv *= own_kv  # a layer reusing another's keys and values keeps none of its own
    attention = e * (q + 2 * kv + q)  # q, k, v and the attention output (flash: no T x T)
    if c.qk_norm:
        attention += e * (q + kv)
    if linear := linear_layers(c):  # hybrid: the DeltaNet layers keep their own
        full = c.n_layers - linear
        attention = (full * attention + linear * saved_bytes(c.linear_attn, e)) / c.n_layers
    if inputs := per_layer_of(c).input_dim:  # Gemma 4's per-layer input: gate input, its
        # gelu, product, norm
        attention += e * (2 * d + 3 * inputs)
    # GELU: its input and the projection's input; SwiGLU: gate and up, silu(gate), product
    mlp = e * (2 * ffn if c.mlp != "swiglu" else 4 * ffn)
    if not fused and not on_gpu:  # as the CPU's profile shows what the plain block keeps
        # RMSNorm keeps its normalised fp32 input too (LayerNorm: statistics only); qkv's
        # whole output stays alive under v (a view of it) beside RoPE's new q and k; proj's
        # input is attention's output and fc2's input the MLP's product, both counted
        # already: the norms' outputs remain
        fp32_residual += 2 * 4 * d if c.norm == "rmsnorm" else 0
        attention += e * (q + kv) if c.positions == "rope" else 0
        matmul_inputs = e * 2 * d
    if fused:  # the linears' inputs are remade or kept as attention's output already
        matmul_inputs, mlp = 0, e * 2 * ffn  # gate and up; GELU: its input and output
        # ... except where LoRA adapts a linear: its A keeps the input (qkv's and fc's norm
        # outputs, proj's product; attention's output is kept already). Measured on the CPU:
        # LoRA rows 7-15% under without it (docs/performance.md); on an H100 the same (0.5B
        # Qwen2 LoRA 28% under without it, 4.6% with it: docs/gpu.md).
        attn_in, mlp_in = e * d, e * (d + ffn)
        if c.moe:
            mlp, mlp_in = _moe_mlp_bytes(c, e, on_gpu)
        matmul_inputs = {"attn": attn_in, "mlp": mlp_in, "all": attn_in + mlp_in}.get(lora, 0)
    if tiled and not fused and not on_gpu:  # a tile keeps its input: ln2's output, counted
        mlp = 0
    elif tiled:  # the MLP's inputs and intermediates live one tile at a time (mlp_tile_bytes)
        matmul_inputs = e * (d + q) if not fused else min(matmul_inputs, e * d)
        mlp = e * d
    dropout_masks = 3 * d if dropout > 0 else 0  # one byte per element
    return fp32_residual + matmul_inputs + attention + mlp + dropout_masks


def _moe_mlp_bytes(c: GPTConfig, e: int, on_gpu: bool) -> tuple[float, float]:
    """A fine-tune's MLP bytes per token, mean over the layers, where some layers hold
    experts: what the MLPs keep, and what LoRA's "mlp" adapters keep beside it. A sparse
    layer keeps its k experts' gate/up product and the gate's activation, their outputs
    (for the routing weights' gradient) and the router's fp32 probabilities; CUDA's grouped
    product keeps its input too (an H100: the 0.5B Qwen3-MoE LoRA row 36% under without
    these, docs/gpu.md). Its adapters sit on the shared expert or dense MLP only (experts'
    own: --lora-experts, not counted)."""
    m = options(c.moe)
    k, d = m["top_k"], c.hidden_dim
    routed, side = widths(c)
    sparse = e * (3 * routed + k * d * (2 if on_gpu else 1) + 2 * side) + 8 * m["n_experts"]
    sparse_in = e * (d + side) if side else 0
    n = sum(is_sparse(c, layer) for layer in range(c.n_layers))
    dense, dense_in = e * 2 * c.ffn_dim, e * (d + c.ffn_dim)
    mean = (n * sparse + (c.n_layers - n) * dense) / c.n_layers
    return mean, (n * sparse_in + (c.n_layers - n) * dense_in) / c.n_layers


def mlp_tiled(cfg: TrainConfig, on_gpu: bool = True) -> bool:
    """Whether the model runs its MLPs in tiles at this context (core.models.model.MLP):
    not where it compiles (the compiler chooses what to keep)."""
    long = tiles_at(cfg.seq_len)
    return long and not compiling.wanted(cfg.compile, "cuda" if on_gpu else "cpu", long)


def _mlp_tile_bytes(c: GPTConfig, precision: str) -> int:
    """One tile's MLP, made again in backward: its inputs, intermediates and their
    gradients."""
    e, ffn = _act_bytes(precision), _token_ffn(c)
    return MLP_TILE_TOKENS * e * (c.hidden_dim + 6 * ffn)


def _score_bytes(cfg: TrainConfig, c: GPTConfig, rows: int, on_gpu: bool) -> int:
    """Attention's T x T scores held for the backward pass: the CPU's math kernel (taken
    with attention dropout: scores, probabilities, dropout mask and dropped probabilities,
    13 bytes an entry measured; its flash kernel keeps none), Gemma 2's soft-capped attention
    and gpt-oss's sinks (as transformers' eager attention keeps them). Under checkpointing
    only the block being recomputed holds them. Where the model runs attention in query chunks at
    this length, one chunk's rows of scores are what to count here."""
    score = (CPU_SCORE_BYTES if not on_gpu and cfg.dropout > 0 else 0) + (
        SOFTCAP_SCORE_BYTES if c.attn_softcap or c.attn_sinks else 0
    )
    if cfg.seq_len > ATTN_CHUNK_QUERIES:  # checkpointed chunks: one chunk's rows at a time
        return int(rows * c.n_heads * ATTN_CHUNK_QUERIES * cfg.seq_len * score)
    # the blocks not checkpointed; a recomputed block's come after theirs are freed
    held = max(c.n_layers - checkpointed(cfg, c, on_gpu), 1)
    return int(held * rows * c.n_heads * cfg.seq_len**2 * score)


def checkpointed(cfg: TrainConfig, c: GPTConfig, on_gpu: bool = True) -> int:
    """How many blocks are checkpointed (0..L): the first checkpoint_blocks (unset: all)
    under gradient checkpointing; where the model offloads them (a GPU, offloaded), every
    block (GPT.forward)."""
    if not cfg.grad_checkpointing:
        return 0
    if cfg.checkpoint_blocks is None or (on_gpu and offloaded(cfg, c)):
        return c.n_layers
    return min(cfg.checkpoint_blocks, c.n_layers)


def _recomputes(cfg: TrainConfig, c: GPTConfig, on_gpu: bool = True) -> bool:
    """Whether a recomputed block adds to the peak: the first k blocks are checkpointed, and
    backward reaches them after the later blocks' saved activations are freed, so only when
    every block is checkpointed does its recomputation come on top."""
    return checkpointed(cfg, c, on_gpu) == c.n_layers


def _measured_activations(
    cfg, c: GPTConfig, run: BlockRun, per_layer: float, tokens: int, logits: int
) -> dict[str, float]:
    """What the blocks and the head hold at the peak, by component (logits included): on a
    GPU, and for a fine-tune's fused blocks on the CPU, as measured (docs/performance.md)."""
    d, fused, on_gpu = c.hidden_dim, run.fused, run.on_gpu
    # The backward's activation gradients and remade tensors are as large as the plain
    # block's saved activations, whatever the forward kept.
    plain = BlockRun(run.dropout, run.precision, tiled=run.tiled)
    grad_layer = _saved_bytes_per_token_layer(c, plain) * tokens
    if run.tiled:
        grad_layer += _mlp_tile_bytes(c, run.precision)
    parts = {}
    k = checkpointed(cfg, c, on_gpu)
    if k:
        # A checkpointed block keeps only its fp32 input, and one is recomputed at a time;
        # the others keep what they save.
        kept = _kept_inputs(cfg, c, on_gpu) if k == c.n_layers else k
        parts[mp.SAVED] = kept * 4 * d * tokens + (c.n_layers - k) * per_layer
        parts[mp.RECOMPUTE] = per_layer if _recomputes(cfg, c, on_gpu) else 0
    else:
        parts[mp.SAVED] = c.n_layers * per_layer
    # Embedding sum, ln_f input (fp32) and the head's input; backward needs about one
    # more block's worth of activation gradients at a time. On the CPU one more under
    # checkpointing (the recomputed block's forward beside them) and one more for a
    # fine-tune's fused blocks (what they remake): measured from 256 to 16k tokens, the
    # first step's runtime counted apart (docs/performance.md).
    extra = 0 if on_gpu else CPU_EXTRA_BLOCK * (_recomputes(cfg, c, on_gpu) + fused)
    parts[mp.LOSS] = 3 * 4 * d * tokens + logits
    parts[mp.GRADS] = (1 + extra) * grad_layer
    return parts


# Offloaded checkpoints (core.models.offload) leave on the card the last block's input, the one
# being recomputed and the one on its way back.
OFFLOAD_KEPT = 3


def run_shape(cfg: TrainConfig, c: GPTConfig | None = None) -> GPTConfig:
    """The config the run's model is built with (core.training.inputs.build_model): c
    (model_shape(cfg)) with cfg's run settings, a pretrained base's with its fused ops."""
    if not cfg.init_from:
        return GPTConfig.from_train(cfg)
    return GPTConfig.from_train(cfg, base=c or model_shape(cfg))


def offloaded(cfg: TrainConfig, c: GPTConfig | None = None) -> bool:
    """Whether the model cfg trains (of shape c: model_shape(cfg)) offloads its checkpoints on
    a GPU: core.models.offload.offloads, asked of the config the model is built with."""
    return offloads(run_shape(cfg, c))


def _kept_inputs(cfg: TrainConfig, c: GPTConfig, on_gpu: bool) -> int:
    """Block inputs checkpointing keeps on the device: every block's, or (offloaded to RAM,
    CUDA only) OFFLOAD_KEPT of them."""
    if on_gpu and offloaded(cfg, c):
        return min(c.n_layers, OFFLOAD_KEPT)
    return c.n_layers


def _shared_kv_bytes(c: GPTConfig, e: int, k: int) -> int:
    """Per token: the keys and values that Gemma 4's last layers reuse, held from their source
    layer's forward to its backward where that layer is among the k checkpointed (the later
    blocks read them beside their inputs); 0 without KV sharing. A source layer that is not
    checkpointed keeps them in its own count."""
    shapes = [layer_shape(c, s) for s in kv_sources(c) if s < k]
    return sum(2 * e * s.n_kv_heads * s.head_dim for s in shapes)


def _cpu_activations(
    cfg, c: GPTConfig, precision: str, per_layer: float, tokens: int, logits: int, tiled: bool
) -> dict[str, float]:
    """A new model's blocks on the CPU, as its profile by component shows them
    (core.training.memory_profile): what the blocks keep, then the larger of the backward's two
    phases. The loss's comes first: ln_f's input, normalised input and output (fp32) beside
    the logits' working set (the `logits` row); its logits are freed before a block's
    backward begins, which holds the recomputed block (checkpointing), the residual stream's
    gradient in and out (fp32) and the MLP's gradients (one tile's where it runs in tiles)."""
    d, e = c.hidden_dim, _act_bytes(precision)
    k = checkpointed(cfg, c, on_gpu=False)
    held = k * 4 * d * tokens + (c.n_layers - k) * per_layer
    mlp = _mlp_tile_bytes(c, precision) if tiled else e * 3 * _token_ffn(c) * tokens
    block = {
        mp.RECOMPUTE: per_layer if _recomputes(cfg, c, on_gpu=False) else 0,
        mp.MLP: mlp,
        mp.GRADS: 2 * 4 * d * tokens,
    }
    loss = {mp.LOSS: 3 * 4 * d * tokens + logits}
    return {mp.SAVED: held, **(block if sum(block.values()) > loss[mp.LOSS] else loss)}


@dataclass
class Estimate:
    n_params: int
    weights: int
    gradients: int
    optimizer: int
    weight_casts: int
    activations: int
    logits: int
    fragmentation: int
    cuda_context: int
    tokens_per_step: int
    flops_per_token: int
    trained: int = 0  # parameters that train (LoRA: the adapters); 0: all of them
    # Training on the CPU: a checkpoint's copy of the state (core.runs.checkpoint.snapshot),
    # in the same memory, after the step's activations are gone.
    snapshot: int = 0
    # GRPO: sampling's KV cache of the G x B completions (held before the step's backward),
    # shown as the method's row (core.config.methods)
    generation: int = 0
    generation_row: str = "sampling"
    runtime: int = 0  # the CPU: what torch's first step loads for good (CPU_RUNTIME_BYTES)
    # activations and logits at the step's peak by component (memory_profile's names)
    step_parts: dict = field(default_factory=dict)
    tower: TowerLoad | None = None  # a vision tower's share (in the rows above too)

    @property
    def allocator_peak(self) -> int:
        """What torch.cuda.max_memory_allocated should report (the CPU: peak RSS over the
        process's start)."""
        step = max(self.activations + self.logits, self.snapshot, self.generation)
        return self.weights + self.gradients + self.optimizer + self.weight_casts + step

    @property
    def device_total(self) -> int:
        """What NVML should report as used by this process at the peak."""
        return self.allocator_peak + self.fragmentation + self.cuda_context + self.runtime

    def breakdown(self) -> list[tuple[str, int]]:
        lora = 0 < self.trained < self.n_params
        return [
            ("weights (base + adapters)" if lora else "weights (fp32)", self.weights),
            ("gradients (adapters)" if lora else "gradients (fp32)", self.gradients),
            ("AdamW state (adapters)" if lora else "optimizer state", self.optimizer),
            ("autocast weight copies", self.weight_casts),
            ("activations", self.activations),
            ("logits and loss", self.logits),
            ("checkpoint copy (CPU)", max(0, self.snapshot - self.activations - self.logits)),
            *([(self.generation_row, self.generation)] if self.generation else []),
            ("allocator fragmentation", self.fragmentation),
            ("CUDA context", self.cuda_context),
            *([("torch runtime (first step)", self.runtime)] if self.runtime else []),
        ]

    def components(self) -> list[tuple[str, int]]:
        """The peak by component, in the words of the measured profile
        (core.training.memory_profile): what the details and benchmarks show side by side."""
        step = self.activations + self.logits
        moment = {k: v for k, v in self.step_parts.items() if v}
        if max(self.snapshot, self.generation) > step:  # the step's peak is elsewhere
            name = self.generation_row if self.generation > self.snapshot else "checkpoint copy"
            moment = {name: max(self.snapshot, self.generation)}
        parts = {
            mp.BASELINE: self.runtime + self.cuda_context,
            mp.WEIGHTS: self.weights + self.weight_casts,
            mp.TRAINABLE: self.gradients + self.optimizer,
            **moment,
            mp.SLACK: self.fragmentation,
        }
        known = [name for name in mp.ORDER if parts.get(name)]
        return [(n, parts[n]) for n in known] + [
            (n, v) for n, v in parts.items() if n not in mp.ORDER and v
        ]

    def components_lines(self) -> list[str]:
        rows = self.components()
        total = sum(v for _, v in rows) or 1
        lines = [f"{name:<24} {v / MB:>10.1f} MiB {100 * v / total:5.1f}%" for name, v in rows]
        return [*lines, f"{'total':<24} {total / MB:>10.1f} MiB"]

    def report(self) -> str:
        lines = [f"{name:<26} {size / MB:>10.1f} MiB" for name, size in self.breakdown()]
        lines += [
            "-" * 41,
            f"{'allocator peak':<26} {self.allocator_peak / MB:>10.1f} MiB",
            f"{'device total (NVML)':<26} {self.device_total / MB:>10.1f} MiB",
            f"parameters                 {self.n_params:,}",
            *(
                [f"trained (LoRA adapters)    {self.trained:,}"]
                if 0 < self.trained < self.n_params
                else []
            ),
            f"tokens per optimizer step  {self.tokens_per_step:,}",
            f"FLOPs per token            {self.flops_per_token / 1e6:,.1f} M",
            *self.tower_lines(),
        ]
        return "\n".join(lines)

    def tower_lines(self) -> list[str]:
        """The vision rows: its weights and activations (in the rows above)."""
        t = self.tower
        if t is None:
            return []
        how = f"{t.trained:,} of its parameters train" if t.trained else "frozen"
        seen = f"{t.images:,} images a micro-batch"
        if t.patches:
            where = (
                "the data's longest example" if t.known else "the most a row holds: an overestimate"
            )
            seen += f", {t.patches:,} patches; {where}"
        return [
            f"vision tower weights       {t.weights / MB:>10.1f} MiB ({how})",
            f"vision tower activations   {t.activations / MB:>10.1f} MiB ({seen})",
        ]


@dataclass
class TowerLoad:
    """The vision tower's share of a step on data with images: its weights (fp32, never
    quantized), what trains of it (--train-vision), and its saved activations for the images
    of a micro-batch (frozen: their pixel values alone)."""

    images: int  # images through the tower per micro-batch
    weights: int  # all of its parameters, fp32
    trained: int  # parameters that train (their gradients and optimizer state beside)
    activations: int
    patches: int = 0  # a dynamic tower's patches per micro-batch (0: a fixed-size tower)
    known: bool = True  # a dynamic tower's images read from the data (else the most a row holds)


_TOWERS: dict[str, dict | None] = {}


def tower_dims(cfg: TrainConfig) -> dict | None:
    """The pretrained model's vision tower sizes (core.weights.vision.tower_dims), or None."""
    if not cfg.init_from:
        return None
    if cfg.init_from not in _TOWERS:  # an estimate is asked many times (the planner's probes)
        from core.weights import vision
        from core.weights.loader import config_only

        _TOWERS[cfg.init_from] = vision.tower_dims(config_only(cfg.init_from).hf_config)
    return _TOWERS[cfg.init_from]


_SHOWN: dict[tuple, bool] = {}


def data_shows_images(cfg: TrainConfig) -> bool:
    """Whether the data's first records show images (a frozen tower then runs in the step):
    an image part anywhere in a record, or an images list. Cheap: 32 records of the first
    file; data that cannot be read here is taken as text (preparing it says what is wrong)."""
    key = (cfg.data, tuple(cfg.data_extensions))
    if key not in _SHOWN:
        _SHOWN[key] = _first_records_show_images(cfg)
    return _SHOWN[key]


def _first_records_show_images(cfg: TrainConfig) -> bool:
    from core.data import images, tables
    from core.data.sources import find_sources
    from core.errors import UserError

    def shows(value) -> bool:
        if isinstance(value, dict):
            return images.is_image_part(value) or any(shows(v) for v in value.values())
        return isinstance(value, list) and any(shows(v) for v in value)

    try:
        files = find_sources(cfg.data, cfg.data_extensions, 0, chat=True).files
        records = tables.first_records(files[0], tables.columns_of(cfg), 32) if files else []
    except (UserError, OSError, ValueError):
        return False
    return any(r.get("images") or shows(r) for r in records if isinstance(r, dict))


def tower_load(
    cfg: TrainConfig, rows: int, e: int, on_gpu: bool, images_per_row: int | None
) -> TowerLoad | None:
    """The tower's memory for rows of this config, where the data shows images (or
    --train-vision says it will). Images a row: images_per_row where the
    data is known, else the most a row can hold (seq_len over an image's tokens: a row of
    short examples full of images). Frozen, the tower runs without gradients and keeps
    nothing; trained, each of its layers keeps per patch what a pre-norm ViT block saves
    (its input and norm, q, k, v, attention output, the MLP's input, inner and activation:
    8 widths and 2 inner widths)."""
    t = tower_dims(cfg)
    if t is None:
        return None
    if not (cfg.train_vision or images_per_row or data_shows_images(cfg)):
        return None  # text: the tower is not loaded
    if t.get("dynamic"):
        return _dynamic_load(cfg, t, rows, e)
    if t.get("pooled"):
        return _pooled_load(cfg, t, rows, e)
    per_row = images_per_row if images_per_row is not None else cfg.seq_len // (t["tokens"] + 2)
    images = rows * max(1, per_row)
    weights = 4 * (t["params"] + t["projector"])
    trained, saved = 0, 0
    if cfg.train_vision:
        trained = _tower_trained(cfg, t)
        p, w = t["patches"], t["width"]
        # attention without a mask: SDPA's fused kernels, CPU and GPU, keep no scores
        block = p * (8 * w + 2 * t["inner"]) * e
        saved = t["layers"] * block + p * w * e  # and the output the projector reads
    pixels = 4 * t["pixels"]  # each image's pixel values, held for the step
    return TowerLoad(images, weights, trained, images * (saved + pixels))


def _tower_trained(cfg: TrainConfig, t: dict) -> int:
    """The tower's parameters that train under --train-vision: LoRA's adapters on every
    linear layer (and a projector with none, whole), or all of them."""
    if not cfg.lora_rank:
        return t["params"] + t["projector"]
    whole = t.get("whole", t["projector"])
    return sum(cfg.lora_rank * (i + o) for i, o in t["linears"]) + whole


@dataclass
class ImageRows:
    """What a row's images ask of a dynamic tower: its images and their patches, from the
    data's longest example (known) or the most a row holds (an overestimate)."""

    images: int
    patches: int
    known: bool


_DYNAMIC: dict[tuple, ImageRows] = {}


def image_rows(cfg: TrainConfig, t: dict) -> ImageRows:
    """A row's images for a dynamic tower (Qwen's): the first records' example with the most
    patches (each image resized as the processor resizes it), else a row of seq_len tokens
    all images at the processor's (or --image-max-pixels') most pixels."""
    key = (cfg.init_from, cfg.data, tuple(cfg.data_extensions), cfg.image_max_pixels)
    if key not in _DYNAMIC:
        spec = _dynamic_spec(cfg, t)
        sizes = _first_records_image_sizes(cfg)
        per = [[_patches(h, w, spec) for h, w in record] for record in sizes]
        if any(per):
            most = max(per, key=sum)
            _DYNAMIC[key] = ImageRows(len(most), sum(most), True)
        else:
            largest = _patches(*_largest_side(spec), spec)
            tokens = largest // t["merge"] ** 2
            images = max(1, cfg.seq_len // (tokens + 2))
            _DYNAMIC[key] = ImageRows(images, cfg.seq_len * t["merge"] ** 2, False)
    return _DYNAMIC[key]


def _processor(cfg: TrainConfig) -> tuple[dict, dict]:
    """The base's image processor settings and config.json ({} where its folder has no
    processor file: the defaults then; loading the model says what is missing)."""
    from core.errors import UserError
    from core.weights.loader import config_only
    from core.weights.vision import preprocessor

    base = config_only(cfg.init_from)
    try:
        return preprocessor(base.folder), base.hf_config
    except UserError:
        return {}, base.hf_config


def _dynamic_spec(cfg: TrainConfig, t: dict):
    from core.data.images import ImageSpec

    pre, _ = _processor(cfg)
    size = pre.get("size") or {}
    return ImageSpec(
        kind="dynamic", placeholder="", token="", token_id=0, before="", after="",
        tokens=0, height=0, width=0, max_pixels=cfg.image_max_pixels,
        patch_size=int(pre.get("patch_size", t["patch"])),
        merge_size=int(pre.get("merge_size", t["merge"])),
        min_pixels=int(size.get("shortest_edge", pre.get("min_pixels", 56 * 56))),
        longest=int(size.get("longest_edge", pre.get("max_pixels", 28 * 28 * 1280))),
    )  # fmt: skip


def _patches(height: int, width: int, spec) -> int:
    from core.data.images import smart_resize

    h, w = smart_resize(height, width, spec)
    return (h // spec.patch_size) * (w // spec.patch_size)


def _largest_side(spec) -> tuple[int, int]:
    """A square image at the most pixels smart_resize allows."""
    most = min(spec.longest, spec.max_pixels) if spec.max_pixels else spec.longest
    side = int(most**0.5)
    return side, side


_SIZES: dict[tuple, list] = {}


def _first_records_image_sizes(cfg: TrainConfig) -> list[list[tuple[int, int]]]:
    """Each of the first 32 records' images' (height, width), read from their headers; a
    record whose images cannot be read counts none (preparing the data says why). Read once
    a data (an estimate is asked many times: the planner's probes)."""
    key = (cfg.data, tuple(cfg.data_extensions))
    if key not in _SIZES:
        _SIZES[key] = _read_image_sizes(cfg)
    return _SIZES[key]


def _read_image_sizes(cfg: TrainConfig) -> list[list[tuple[int, int]]]:
    from pathlib import Path

    from PIL import Image

    from core.data import images, tables
    from core.data.sources import find_sources
    from core.errors import UserError

    def paths(value) -> list:
        if isinstance(value, dict):
            if images.is_image_part(value):
                return [images.part_path(value)]
            return [p for v in value.values() for p in paths(v)]
        return [p for v in value for p in paths(v)] if isinstance(value, list) else []

    try:
        files = find_sources(cfg.data, cfg.data_extensions, 0, chat=True).files
        records = tables.first_records(files[0], tables.columns_of(cfg), 32) if files else []
    except (UserError, OSError, ValueError):
        return []
    out = []
    for r in records:
        if not isinstance(r, dict):
            continue
        named = paths(r) + [p for p in (r.get("images") or []) if isinstance(p, str)]
        try:
            sizes = []
            for name in named:
                with Image.open(images.image_path(name, Path(files[0]).parent)) as im:
                    sizes.append((im.height, im.width))
            out.append(sizes)
        except (UserError, OSError, ValueError):
            continue
    return out


def _dynamic_load(cfg: TrainConfig, t: dict, rows: int, e: int) -> TowerLoad:
    """A dynamic tower's memory (tower_load) per patch of a row's images: their patch values
    (fp32) and the mergers' outputs (the merger's and DeepStack's, held to the language
    layers); trained, each block keeps per patch what Qwen's block saves (its input and norm,
    q, k and v, the rotated q and k, the attention output and its copy, the MLP's input and
    norm: 12 widths and 2 inner widths), and each merger its norm, input and inner (3 widths);
    frozen, it keeps nothing but a block's tensors are in flight."""
    seen = image_rows(cfg, t)
    w, tokens = t["width"], seen.patches // t["merge"] ** 2
    held = 4 * seen.patches * t["pixels"] + e * tokens * t["mergers"] * t["out"]
    trained, block = 0, seen.patches * (12 * w + 2 * t["inner"]) * e
    if cfg.train_vision:
        trained = _tower_trained(cfg, t)
        held += t["layers"] * block + t["mergers"] * seen.patches * 3 * w * e
    else:  # frozen: a block's widest moment in flight (attention's input, norm, q, k and v
        # and the rotated q and k; or the MLP's), all of a row's patches at once
        held += seen.patches * max(8 * w, 2 * w + 2 * t["inner"]) * e
    weights = 4 * (t["params"] + t["projector"])
    return TowerLoad(
        rows * seen.images, weights, trained, rows * held, rows * seen.patches, seen.known
    )


def _pooled_load(cfg: TrainConfig, t: dict, rows: int, e: int) -> TowerLoad:
    """Gemma 4's tower's memory (tower_load): every image is its token budget's patches
    (padded), so a row's images are what varies: the data's longest example's, else as many
    budgets as seq_len holds. Per patch: its pixels and positions (fp32), and trained, what
    a layer keeps (its four norms, the clipped linears' inputs and outputs, q, k, v normed
    and rotated, the keys and values repeated to the query's heads, attention and its copy,
    the gated MLP's five inner widths) and the pooling's weights; frozen, the widest moment
    of a layer, all the images at once."""
    from core.weights.vision import gemma4_budget

    patch, k, soft = gemma4_budget(*_processor(cfg), cfg.image_max_pixels)
    per_image = soft * k * k
    counts = [len(r) for r in _first_records_image_sizes(cfg)]
    known = any(counts)
    images = max(counts) if known else max(1, cfg.seq_len // (soft + 2))
    w, a, kv, inner = t["width"], t["heads"], t["kv"], t["inner"]
    block = per_image * (17 * w + 9 * a + 6 * kv + 5 * inner) * e
    held = per_image * 4 * (3 * patch * patch + 2) + soft * t["out"] * e
    trained = 0
    if cfg.train_vision:
        trained = _tower_trained(cfg, t)
        held += t["layers"] * block + per_image * (soft * 4 + w * 4)
    else:  # the gated MLP's moment: its inputs, the clipped gate and up and their product
        held += per_image * (4 * w + 5 * inner) * e
    weights = 4 * (t["params"] + t["projector"])
    n = rows * images
    return TowerLoad(n, weights, trained, n * held, n * per_image, known)


OPTIMIZER_BYTES = {"adamw8bit": 2}  # a trained weight's optimizer state, when not 8

# Bytes a weight of a quantized base layer: NF4 codes, an 8-bit scale per 64 weights and an
# fp32 scale per 256 of those (double quantization); int8 with a scale per row.
QUANT_BYTES = {4: 0.5 + 1 / 64 + 4 / (64 * 256), 8: 1.0}


def _base_bytes(cfg: TrainConfig, c: GPTConfig, n: int, sixteen: bool) -> int:
    """The frozen base under LoRA (recipe.base_bits); a 4- or 8-bit base quantizes the adapted
    layers only (4 bits: a mixture of experts' experts too), the rest stays in 16 or 32 bits."""
    bits = recipe.base_bits(cfg, sixteen)
    if bits in QUANT_BYTES:
        q = adapted_weights(_counting_shape(c), cfg.lora_targets)
        q += expert_params(_counting_shape(c))[0] if bits == 4 else 0
        return int(q * QUANT_BYTES[bits]) + (2 if sixteen else 4) * (n - q)
    return bits // 8 * n


def estimate(
    cfg: TrainConfig,
    precision: str | None = None,
    on_gpu: bool = True,
    images_per_row: int | None = None,
) -> Estimate:
    """Peak memory of one micro-batch's forward/backward plus the optimizer step.
    images_per_row: a vision model's images in a row where the data is known (tower_load)."""
    if precision is None:
        precision = pick_precision(cfg.precision, on_gpu)  # a modern GPU's choice
    c = model_shape(cfg)
    n = _params(c)
    # DPO: a pair's chosen and rejected answers go through the model in one batch; the
    # reference is the adapters-off model under no_grad (nothing kept) or cached log-probs.
    rows = cfg.batch_size * objectives.rows_per_example(cfg)
    tokens = rows * cfg.seq_len
    fused = run_shape(cfg, c).fused  # a fine-tune's model (core.models.fused)
    # LoRA's kept inputs: measured on the CPU; a GPU keeps its constants until measured
    lora = cfg.lora_targets if cfg.lora_rank else ""
    tiled = mlp_tiled(cfg, on_gpu)
    e = _act_bytes(precision)
    # LinearCrossEntropy (one fp32 block, in place) serves a plain head; Gemma 2's
    # soft-capped logits take the checkpointed chunks (core.models.loss.fusable).
    if fused and precision == "fp32" and not c.logit_softcap:
        fused_chunk = chunk_positions(c.vocab_size, fused=True, hidden_dim=c.hidden_dim)
        logits = min(tokens, fused_chunk) * c.vocab_size * 4
    else:  # logits, their fp32 copy and its gradient, for one chunk of positions at a time
        logits = min(tokens, chunk_positions(c.vocab_size)) * c.vocab_size * (e + 4 + 4)
    run = BlockRun(cfg.dropout, precision, fused, lora, tiled, on_gpu)
    per_layer = _saved_bytes_per_token_layer(c, run) * tokens
    if not fused and not on_gpu:
        parts = _cpu_activations(cfg, c, precision, per_layer, tokens, logits, tiled)
    else:
        parts = _measured_activations(cfg, c, run, per_layer, tokens, logits)
    parts[mp.ATTENTION] = _score_bytes(cfg, c, rows, on_gpu)
    if inputs := per_layer_of(c).input_dim:  # Gemma 4's per-layer inputs, every layer's at
        # once (fp32): looked up, projected and mixed
        parts[mp.SAVED] = parts.get(mp.SAVED, 0) + 12 * c.n_layers * inputs * tokens
    if k := checkpointed(cfg, c, on_gpu):  # beside the checkpoints: the keys and values shared
        parts[mp.SAVED] = parts.get(mp.SAVED, 0) + _shared_kv_bytes(c, e, k) * tokens
    activations = sum(parts.values()) - logits  # the logits are their own row
    mixed = precision in ("bf16", "fp16")
    weight_casts = 2 * (n - _position_params(c)) if mixed else 0
    trained, weights = n, 4 * n
    if cfg.lora_rank:  # a frozen base + fp32 adapters
        trained = adapter_count(_counting_shape(c), cfg.lora_rank, cfg.lora_targets)
        _, routers, experts = expert_params(_counting_shape(c), cfg.lora_rank)
        trained += experts * cfg.lora_experts + routers * cfg.train_router
        weights = _base_bytes(cfg, c, n, mixed and on_gpu) + 4 * trained
        weight_casts = 0  # the base is kept as it is; the adapters' casts are negligible
    # AdamW: two fp32 moments; 8-bit AdamW: two 8-bit moments (and a scale per 256)
    optimizer = OPTIMIZER_BYTES.get(recipe.optimizer(cfg), 8) * trained
    if recipe.optimizer(cfg) == "muon":
        optimizer -= 4 * hidden_matrix_params(_counting_shape(c))
    tower = tower_load(cfg, rows, e, on_gpu, images_per_row)
    if tower is not None:  # its weights, what trains of it, its activations
        weights += tower.weights
        trained += tower.trained
        optimizer += OPTIMIZER_BYTES.get(recipe.optimizer(cfg), 8) * tower.trained
        parts[mp.VISION] = tower.activations
        activations += tower.activations
    generation, grpo_logits, reference = objectives.extra_memory(cfg, c, e, weights)
    logits = grpo_logits or logits  # GRPO's loss reads the completion positions' only
    weights += reference
    live = weights + 4 * trained + optimizer + weight_casts + int(activations) + logits
    return Estimate(
        n_params=n,
        weights=weights,
        gradients=4 * trained,
        optimizer=optimizer,
        weight_casts=weight_casts,
        activations=int(activations),
        logits=logits,
        fragmentation=int(((FRAGMENTATION if on_gpu else CPU_FRAGMENTATION) - 1) * live),
        cuda_context=CUDA_CONTEXT_BYTES if on_gpu else 0,
        runtime=0 if on_gpu else CPU_RUNTIME_BYTES,
        tokens_per_step=cfg.tokens_per_step,
        flops_per_token=flops_per_token(cfg, c),
        trained=trained,
        snapshot=0 if on_gpu else 4 * (trained if cfg.lora_rank else n) + optimizer,
        generation=generation,
        generation_row=methods.of(cfg).sampling_row or "sampling",
        step_parts={k: int(v) for k, v in parts.items() if v},
        tower=tower,
    )


def usable_bytes(free_bytes: int) -> int:
    """What a run may plan to use of free memory: all but the safety margin."""
    return int(free_bytes * (1 - SAFETY_MARGIN))


def fits(cfg: TrainConfig, free_bytes: int) -> bool:
    return estimate(cfg).device_total <= usable_bytes(free_bytes)


def base_saving(cfg: TrainConfig) -> tuple[int, int] | None:
    """A LoRA run on a 4- or 8-bit base: (its bits, bytes saved against a 16-bit base)."""
    if not cfg.lora_rank or cfg.base_bits not in ("4", "8"):
        return None
    c = model_shape(cfg)
    n = _params(c)
    sixteen = dataclasses.replace(cfg, base_bits="16")
    return int(cfg.base_bits), _base_bytes(sixteen, c, n, True) - _base_bytes(cfg, c, n, True)
