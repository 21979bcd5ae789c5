"""The fields of TrainConfig, one declaration each (default, help, form label and group, range,
resume rules, CLI flag), in groups: core.config.spec joins them with each method's own fields
(core.config.methods) and validates."""

from __future__ import annotations

from dataclasses import dataclass

from core.config import methods
from core.config.declare import ADVANCED, BATCH, DATA, EXECUTION, INTERVALS, MODEL, spec

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
LORA_TARGETS = ("attn", "mlp", "all")
LORA_TARGET_HELP = (
    "layers that get LoRA adapters; attn: attention projections (Llama, Mistral, Qwen, Gemma, "
    "SmolLM3: q_proj, k_proj, v_proj, o_proj; Phi-3: qkv_proj, o_proj; GPT-2: c_attn, "
    "attn.c_proj); mlp: feed-forward (gate_proj, up_proj, down_proj; Phi-3: gate_up_proj, "
    "down_proj; GPT-2: c_fc, mlp.c_proj); all: both"
)
TOKENIZERS = ("bytes", "bpe", "model")  # model: the pretrained model's own (init_from)
DATA_FORMATS = ("auto", "text", "chat", "preference")  # chat: core.data.chatdata; preference: pairs
ARCHS = ("gpt2", "llama")
BASE_BITS = ("auto", "4", "8", "16", "32")  # as strings: as written on the command line
OPTIMIZERS = ("auto", "adamw", "adamw8bit", "muon")  # auto: muon new, adamw fine-tune
SCHEDULES = ("cosine", "wsd")
DECAY_SHAPES = ("linear", "sqrt")  # sqrt: 1 - sqrt(progress)
THINKING = ("default", "on", "off")  # a chat template's enable_thinking (core.data.chat)


@dataclass
class ModelFields:
    """What the network is: shape, architecture, LoRA."""

    # model
    init_from: str | None = spec(
        None,
        "start from a pretrained model: a Hugging Face model folder or hub id of a family "
        "TrainDeck reads (core.weights.families; the window's Start from dialog and "
        "docs/fine-tuning.md list them); default: a new model",
        optional=True,
        arch=True,
    )
    hidden_dim: int = spec(
        128,
        "model width; must divide by n_heads",
        label="Hidden dim",
        group=MODEL,
        low=8,
        high=16384,
        arch=True,
    )
    n_layers: int = spec(
        2, "transformer blocks", label="Layers", group=MODEL, low=1, high=256, arch=True
    )
    n_heads: int = spec(
        4,
        "attention heads; hidden_dim / n_heads is the head size",
        label="Heads",
        group=MODEL,
        low=1,
        high=256,
        arch=True,
    )
    seq_len: int = spec(
        128,
        "context length in tokens",
        label="Context length",
        group=MODEL,
        low=8,
        high=65536,
        arch=True,
    )
    arch: str = spec(
        "llama",
        "a new model's architecture; llama: RMSNorm, rotary positions, SwiGLU, no biases "
        "(exports as a Llama model); gpt2: LayerNorm, learned positions, GELU (nanoGPT's). "
        "A pretrained model keeps its own",
        label="Architecture",
        group=MODEL,
        choices=ARCHS,
        arch=True,
    )
    n_kv_heads: int | None = spec(
        None,
        "llama: key/value heads for grouped-query attention; must divide n_heads "
        "(default: n_heads)",
        low=1,
        high=256,
        optional=True,
        arch=True,
    )
    qk_norm: bool = spec(
        False,
        "llama: RMSNorm over each head of q and k (exports as a Qwen3 model)",
        label="QK-norm",
        group=ADVANCED,
        arch=True,
    )
    ffn_dim: int | None = spec(
        None,
        "the MLP's inner width; unset: llama's SwiGLU 8/3 of hidden_dim rounded up to 32, "
        "gpt2's 4x (the GPU tier presets set a multiple of 128, which tensor cores tile whole)",
        low=8,
        high=65536,
        optional=True,
        arch=True,
    )
    dropout: float = spec(
        0.0, "dropout probability", label="Dropout", group=ADVANCED, low=0.0, high=0.9
    )
    # LoRA: 0 trains every weight; R > 0 freezes them and trains rank-R adapters
    lora_rank: int = spec(
        0,
        "LoRA adapter rank; 0: full fine-tuning (every weight trains)",
        label="LoRA rank",
        group=MODEL,
        low=0,
        high=4096,
        arch=True,
    )
    train_vision: bool = spec(
        False,
        "vision models on chat data with images: the vision tower and its projector train "
        "too (under LoRA: adapters on their linear layers, a projector without any trains "
        "whole; under full fine-tuning: every weight of theirs); default: frozen",
        label="Train vision tower",
        group=MODEL,
        arch=True,
        state=True,
    )
    lora_alpha: float | None = spec(
        None,
        "LoRA scale numerator (the update is alpha / rank * B A); default: 2 x rank",
        low=1e-6,
        high=1e6,
        optional=True,
        arch=True,
    )
    lora_dropout: float = spec(
        0.0, "dropout on the LoRA input", label="LoRA dropout", group=ADVANCED, low=0.0, high=0.9
    )
    lora_targets: str = spec(
        "all",
        LORA_TARGET_HELP,
        label="LoRA targets",
        group=ADVANCED,
        choices=LORA_TARGETS,
        arch=True,
    )
    lora_experts: bool = spec(
        False,
        "mixture-of-experts models: each expert's projections get their own LoRA adapter "
        "pair too (PEFT's target_parameters on mlp.experts.gate_up_proj / down_proj); "
        "needs lora_rank > 0 and a model with experts",
        label="LoRA on experts",
        group=ADVANCED,
        arch=True,
    )
    train_router: bool = spec(
        False,
        "mixture-of-experts models: the router (which experts each token goes to) trains "
        "too; default: frozen under every method (under LoRA its own weights train, saved "
        "in checkpoints and exports)",
        label="Train router",
        group=ADVANCED,
        state=True,
    )
    base_bits: str = spec(
        "auto",
        "the frozen base's precision under LoRA: 4 (NF4 with double quantization: QLoRA, "
        "through bitsandbytes; a mixture of experts' experts too, per expert), 8 (int8), "
        "16, 32; auto: 16 on a GPU in 16-bit precision, "
        "else 32",
        label="Base precision",
        group=ADVANCED,
        choices=BASE_BITS,
    )
    router_aux_loss: float | None = spec(
        None,
        "a mixture-of-experts model's load-balancing loss coefficient (transformers' "
        "router_aux_loss_coef, added to the loss as coefficient x aux); 0: off; default: "
        "the model's config.json (its coefficient where output_router_logits is true, else off)",
        low=0.0,
        high=10.0,
        optional=True,
    )
    bias: bool = spec(
        True,
        "biases in Linear and LayerNorm layers (without, as nanoGPT's bias=False: a bit faster)",
        label="Biases",
        group=ADVANCED,
        arch=True,
    )


@dataclass
class ScheduleFields:
    """How it learns: batch, optimizer, schedule, length of the run."""

    # batch and schedule
    batch_size: int = spec(
        8, "sequences per micro-batch", label="Batch size", group=BATCH, low=1, high=65536
    )
    grad_accum: int = spec(
        1,
        "micro-batches per optimizer step",
        label="Grad accumulation",
        group=BATCH,
        low=1,
        high=65536,
    )
    optimizer: str = spec(
        "auto",
        "muon: Muon for the hidden weight matrices, AdamW for embeddings, head and norms; "
        "adamw: AdamW for all; adamw8bit: AdamW with 8-bit state (bitsandbytes, 2 bytes a "
        "weight instead of 8); auto: muon for a new model, adamw for a pretrained one",
        label="Optimizer",
        group=BATCH,
        choices=OPTIMIZERS,
        state=True,
    )
    lr: float | None = spec(
        None,
        "peak learning rate of AdamW (with muon: of the embeddings, head and norms); "
        "default: scaled with the model's width (core.config.recipe)",
        label="Learning rate",
        group=BATCH,
        low=1e-8,
        high=1.0,
        optional=True,
    )
    muon_lr: float | None = spec(
        None,
        "peak learning rate of Muon's hidden matrices (default: core.config.recipe's)",
        label="Muon lr",
        group=ADVANCED,
        low=1e-8,
        high=10.0,
        optional=True,
    )
    warmup_steps: int = spec(20, "linear warmup steps", label="Warmup steps", group=BATCH, low=0)
    schedule: str = spec(
        "cosine",
        "cosine: decay from the first step after warmup; wsd: warmup, a stable phase, then "
        "a decay over the last decay_fraction of the run (a run can be finished early)",
        label="Schedule",
        group=BATCH,
        choices=SCHEDULES,
    )
    decay_fraction: float = spec(
        0.2,
        "wsd: share of the run spent decaying the learning rate; also the default length "
        "of a Finish cooldown, as a share of the steps done",
        label="Decay share",
        group=ADVANCED,
        low=0.0,
        high=1.0,
    )
    decay_shape: str = spec(
        "linear",
        "wsd and Finish: linear, or sqrt (1 - sqrt of the progress: drops fast, then slowly)",
        label="Decay shape",
        group=ADVANCED,
        choices=DECAY_SHAPES,
    )
    finish_steps: int | None = spec(
        None,
        "steps of the cooldown a Finish request runs before saving and stopping "
        "(default: decay_fraction x the steps done)",
        low=1,
        optional=True,
    )
    max_time: str | None = spec(
        None,
        "train for this long, e.g. 90s, 45m, 2h, 1h30m (overrides --max-steps and "
        "--max-epochs): steps are planned from the measured speed",
        optional=True,
    )
    max_steps: int | None = spec(
        500,
        "optimizer steps to train",
        label="Train for",
        group=BATCH,
        low=1,
        optional=True,
        widget="limit",
    )
    max_epochs: float | None = spec(
        None, "passes over the training tokens (overrides --max-steps)", low=0.001, optional=True
    )
    min_lr_ratio: float = spec(
        0.1,
        "final lr as a fraction of the peak",
        label="Min lr ratio",
        group=ADVANCED,
        low=0.0,
        high=1.0,
    )
    weight_decay: float = spec(
        0.1, "AdamW weight decay", label="Weight decay", group=ADVANCED, low=0.0, high=1.0
    )
    beta1: float = spec(
        0.9, "AdamW beta1 (momentum)", label="AdamW beta1", group=ADVANCED, low=0.0, high=0.9999
    )
    beta2: float = spec(
        0.95,
        "AdamW beta2 (0.99 suits small models and data)",
        label="AdamW beta2",
        group=ADVANCED,
        low=0.0,
        high=0.99999,
    )
    grad_clip: float = spec(
        1.0, "max gradient norm; 0 disables clipping", label="Grad clip", group=ADVANCED, low=0.0
    )


@dataclass
class ExecutionFields:
    """Where and how it runs: precision, device, compile, seed."""

    # execution
    precision: str = spec(
        "auto",
        "auto: bf16 where the GPU supports it, else fp16; fp32 on the CPU",
        label="Precision",
        group=EXECUTION,
        choices=PRECISIONS,
    )
    device: str = spec(
        "auto",
        "auto | cpu | cuda | cuda:N (auto: the first CUDA GPU if there is one, else the CPU)",
        label="Device",
        group=EXECUTION,
        widget="device",
    )
    compile: bool | None = spec(
        None,
        "torch.compile each transformer block (compiled once, reused by every layer): faster "
        "steps after a first step that compiles. Unset (the default): on a CUDA GPU where "
        "Triton imports, not on the CPU; --compile: on the CPU too; --no-compile: never",
        label="torch.compile",
        group=EXECUTION,
        optional=True,
    )
    compile_mode: str = spec(
        "default",
        "torch.compile's mode: default; reduce-overhead adds CUDA graphs (fewer kernel "
        "launches, for small models with fixed shapes); max-autotune-no-cudagraphs tries "
        "more kernels while compiling",
        label="Compile mode",
        group=ADVANCED,
        choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
    )
    grad_checkpointing: bool = spec(
        False,
        "recompute activations in the backward pass: less memory, about 30% slower",
        label="Gradient checkpointing",
        group=EXECUTION,
    )
    checkpoint_blocks: int | None = spec(
        None,
        "with gradient checkpointing: how many blocks (the first ones) are checkpointed; the "
        "others keep their activations, so a step recomputes less. Unset: every block. Fit to "
        "my GPU picks the fewest that fit the card at its batch",
        low=0,
        high=256,
        optional=True,
    )
    offload_checkpoints: bool = spec(
        False,
        "with gradient checkpointing on a CUDA GPU: keep each layer's saved input in pinned RAM "
        "(fetched back a layer ahead) for longer contexts; no effect on the CPU",
        label="Offload checkpoints to RAM",
        group=EXECUTION,
    )
    shard: bool = spec(
        False,
        "under torchrun: shard every block's weights, gradients and optimizer state across "
        "the processes (FSDP2), so a model that does not fit one GPU trains on several "
        "(docs/multi-gpu.md)",
    )
    devices: str = spec(
        "",
        "split the model's layers across these devices in one process, e.g. cuda:0,cuda:1: "
        "consecutive blocks on each card in proportion to its free memory; any OS, no NCCL "
        "(docs/multi-gpu.md). cpu,cpu stands in for two cards (tests). Empty: one device",
        optional=True,
    )
    deterministic: bool = spec(
        False,
        "deterministic kernels, so CUDA runs repeat bit for bit (slower)",
        label="Deterministic",
        group=ADVANCED,
    )
    seed: int = spec(
        1337,
        "random seed",
        label="Seed",
        group=ADVANCED,
        low=0,
        high=2**63 - 1,
        stream=True,
        widget="text",
    )


@dataclass
class DataFields:
    """What it learns from: data, tokenizer, format, split."""

    # data: None means the embedded default corpus
    data: str | None = spec(
        None,
        "a text file or a folder of them, or a Hugging Face dataset id (owner/name); give "
        "--data again to mix several sources (default: the embedded corpus)",
        optional=True,
        stream=True,
        repeat=True,  # not commas: Windows paths hold any of them
    )
    # more sources mixed with data (the CLI's repeated --data); core.data.mix draws from them
    extra_data: list[str] = spec(
        [],
        "more data sources mixed with the first: files, folders, Hugging Face dataset ids "
        "or 'embedded' (the CLI: --data given again)",
        cli=False,
        stream=True,
    )
    data_weights: str | None = spec(
        None,
        "each data source's share of the training sequences, comma separated, one per "
        "--data, e.g. 0.8,0.2 (default: proportional to each source's training tokens)",
        optional=True,
        stream=True,
    )
    data_split: str = spec(
        "train",
        "the split read from a Hugging Face dataset id given as --data (its files whose "
        "path names the split)",
        stream=True,
    )
    eval_data: str | None = spec(
        None,
        "a second validation set, scored at every evaluation beside the run's own: a text "
        "file, a folder of them, or 'embedded' (the embedded corpus, general code and "
        "English). A fine-tune whose own validation loss falls while this one rises is "
        "forgetting what it knew",
        label="Second validation",
        group=DATA,
        optional=True,
        placeholder="none; a file, a folder, or embedded (general text)",
        widget="text",
    )
    tokenizer: str = spec(
        "bytes",
        "bytes: 256 tokens, nothing to learn; bpe: a byte-level BPE learned from your data "
        "once (Hugging Face tokenizers), fewer tokens per byte; model: a pretrained "
        "model's own (set by init_from)",
        label="Tokenizer",
        group=DATA,
        choices=TOKENIZERS,
        arch=True,
    )
    vocab_size: int = spec(
        8192,
        "BPE vocabulary size (with tokenizer bpe; bytes always have 256)",
        label="BPE vocab",
        group=DATA,
        low=512,
        high=65536,
        arch=True,
    )
    data_format: str = spec(
        "auto",
        "text: plain text; chat: .jsonl examples (messages, prompt/completion or Alpaca) "
        "rendered with the model's chat template, loss on the answers only; preference: "
        ".jsonl pairs (prompt, chosen, rejected) for method dpo; auto: preference or chat "
        "for .jsonl data by its fields, else text",
        label="Data format",
        group=DATA,
        choices=DATA_FORMATS,
        stream=True,
    )
    method: str = spec(
        methods.DEFAULT,
        methods.HELP,
        label="Method",
        group=DATA,
        choices=methods.NAMES,
        stream=True,
    )


@dataclass
class ReadingFields:
    """How data is read: chat masks and long examples, table columns, file endings, the
    held-out share and size caps (after the methods' fields, core.config.methods)."""

    train_on_prompts: bool = spec(
        False,
        "chat data: let system and user turns carry the loss too (default: answers only)",
        label="Train on prompts",
        group=ADVANCED,
        stream=True,
    )
    drop_long: bool = spec(
        False,
        "chat data: skip examples longer than the context (default: truncate them)",
        label="Drop long examples",
        group=ADVANCED,
        stream=True,
    )
    image_max_pixels: int | None = spec(
        None,
        "chat data with images: the most pixels an image is resized to (a model of dynamic "
        "resolution; Gemma 4: the largest of its token budgets within it); a fixed-size tower "
        "(Gemma 3) resizes to its own size (default: the model's processor's)",
        label="Image max pixels",
        group=ADVANCED,
        low=784,
        high=100_000_000,
        optional=True,
        stream=True,
    )
    skip_bad_lines: bool = spec(
        False,
        "chat data: skip and count malformed lines (default: stop at the first, naming it)",
        label="Skip bad lines",
        group=ADVANCED,
        stream=True,
    )
    thinking: str = spec(
        "default",
        "chat: the template's thinking switch (enable_thinking) for the chat data, prompts, "
        "generation and evaluation of the run; on or off need a template that has one (Qwen3, "
        "Qwen3.5, SmolLM3, Gemma 4); default: the template's own (Qwen3 thinks, Gemma 4 not)",
        label="Thinking",
        group=ADVANCED,
        choices=THINKING,
        stream=True,
    )
    text_column: str | None = spec(
        None,
        "the column of a .parquet, .csv, .json or .jsonl data file holding plain text, one "
        "document a row (default: text)",
        label="Text column",
        group=ADVANCED,
        optional=True,
        stream=True,
        widget="text",
    )
    messages_column: str | None = spec(
        None,
        "the column holding a conversation: a list of role/content (or ShareGPT from/value) "
        "turns (default: messages or conversations)",
        label="Messages column",
        group=ADVANCED,
        optional=True,
        stream=True,
        widget="text",
    )
    prompt_column: str | None = spec(
        None,
        "the column holding the prompt or question (default: prompt)",
        label="Prompt column",
        group=ADVANCED,
        optional=True,
        stream=True,
        widget="text",
    )
    completion_column: str | None = spec(
        None,
        "the column holding the answer to learn (default: completion)",
        label="Completion column",
        group=ADVANCED,
        optional=True,
        stream=True,
        widget="text",
    )
    chosen_column: str | None = spec(
        None,
        "preference data: the column holding the preferred answer (default: chosen)",
        label="Chosen column",
        group=ADVANCED,
        optional=True,
        stream=True,
        widget="text",
    )
    rejected_column: str | None = spec(
        None,
        "preference data: the column holding the rejected answer (default: rejected)",
        label="Rejected column",
        group=ADVANCED,
        optional=True,
        stream=True,
        widget="text",
    )
    data_extensions: list[str] = spec(
        [".txt", ".md"],
        "file endings read from a data folder, comma separated",
        label="File endings",
        group=ADVANCED,
        stream=True,
        widget="text",
    )
    val_fraction: float = spec(
        0.05,
        "share of the data held out for validation",
        label="Validation share",
        group=ADVANCED,
        low=0.001,
        high=0.5,
        stream=True,
    )
    corpus_max_bytes: int = spec(
        4_000_000,
        "bytes of the embedded corpus used (your own data is used whole)",
        label="Corpus cap (bytes)",
        group=ADVANCED,
        low=10_000,
        stream=True,
    )
    max_data_bytes: int | None = spec(
        None,
        "use only the first N bytes of your data (default: all of it)",
        low=1000,
        optional=True,
        stream=True,
    )


@dataclass
class IntervalFields:
    """How often it evaluates, saves and samples."""

    # intervals
    eval_every: int = spec(
        100, "steps between validation runs", label="Eval every", group=INTERVALS, low=1
    )
    ckpt_every: int = spec(
        200, "steps between checkpoints", label="Checkpoint every", group=INTERVALS, low=1
    )
    log_every: int = spec(
        10,
        "steps between metric reads (each read syncs the GPU)",
        label="Log every",
        group=INTERVALS,
        low=1,
    )
    eval_batches: int = spec(
        8,
        "validation batches (optimizer-step sized) per eval",
        label="Eval batches",
        group=ADVANCED,
        low=1,
        high=10_000,
    )
    keep_checkpoints: int = spec(
        3, "step-NNNNNN.pt files kept", label="Keep checkpoints", group=ADVANCED, low=0, high=1000
    )
    sample_tokens: int = spec(
        200,
        "tokens of text generated at each evaluation",
        label="Sample tokens",
        group=ADVANCED,
        low=0,
        high=100_000,
    )
    # informational: which preset filled this in
    preset: str | None = spec(None, "the preset this config came from", optional=True, cli=False)
