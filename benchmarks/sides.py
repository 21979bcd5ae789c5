"""What the benchmarks that compare TrainDeck with transformers share (finetune.py, moe.py and
gpu_check.py): a random pretrained start built from a transformers config class, the config of
a TrainDeck run that starts from it, and the transformers (+ peft, + Liger) baseline, a user's
own script, that TrainDeck is measured against."""

from __future__ import annotations

import contextlib
from pathlib import Path

# peft's adapters on every projection of a Llama/Qwen-style block
PEFT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SPECIALS = ("<|endoftext|>",)


# -- the start: a random model with a small BPE tokenizer, as --init-from reads it ------------


def build_start(
    folder: Path,
    config_class: str,
    shape: dict,
    text: bytes,
    bpe_vocab: int,
    specials: tuple[str, ...] = SPECIALS,
    dtype=None,
    device: str = "cpu",
    **config_kw,
) -> None:
    """A random model of transformers' `config_class` (e.g. "LlamaConfig") and `shape`, seeded,
    saved with a BPE tokenizer learnt from `text`; the vocabulary is the shape's, or the
    tokenizer's where that is larger. dtype: the saved weights' (None: fp32)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from core.data.tokenizer import train_bpe

    hf = train_bpe([text], bpe_vocab).hf
    hf.add_special_tokens(list(specials))
    tok = PreTrainedTokenizerFast(tokenizer_object=hf, eos_token=specials[0])
    tok.save_pretrained(folder)
    shape = {**shape, "vocab_size": max(shape.get("vocab_size", 0), len(tok))}
    make_config = getattr(transformers, config_class)
    config = make_config(**shape, eos_token_id=tok.eos_token_id, **config_kw)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder)


def stdlib_text(n_bytes: int) -> bytes:
    """The embedded corpus's first n_bytes (Python's standard library): tokenizer text."""
    from core.data.build_text import read_blocks
    from core.data.sources import _stdlib_files

    return b"".join(read_blocks(_stdlib_files(), n_bytes))


# -- TrainDeck's side --------------------------------------------------------------------------


def pretrained_config(folder, pre=None, **fields):
    """The validated TrainConfig of a run that starts from the model in `folder` (its shape
    filled in from its config.json, as --init-from does); pre: the opened folder, if at hand."""
    from core.config.spec import TrainConfig, validate
    from core.weights.loader import apply_pretrained, config_only

    cfg = validate(TrainConfig(init_from=str(folder), tokenizer="model", **fields))
    return validate(apply_pretrained(cfg, pre if pre is not None else config_only(folder)))


def traindeck_model(cfg, pre) -> tuple:
    """TrainDeck's (model, optimizer) on the CPU in fp32, as a run builds them (the heap as a
    run's setup sets it)."""
    import torch

    from core.training import inputs, optim, planner

    cpu = torch.device("cpu")
    inputs.set_switches(cfg, cpu, planner.heap_choice(cfg).lean)
    torch.manual_seed(0)
    model = inputs.build_model(cfg, pre, cpu, "fp32", lambda m: None)
    model.train()
    return model, optim.make(model, cfg)


def traindeck_step(model, opt, plain: bool = False):
    """step(x, y) -> the loss as a float, of TrainDeck's model and optimizer. plain: the
    model's logits and one cross-entropy over them, instead of its own chunked loss."""
    import torch
    import torch.nn.functional as F

    scaler = torch.amp.GradScaler("cuda", enabled=False)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        if plain:
            logits = model.logits(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        else:
            _, loss = model(x, y)
        loss.backward()
        opt.step(scaler)
        return loss.item()

    return step


# -- the baseline: transformers (+ peft adapters, + Liger Kernel) ------------------------------


def hf_model(
    folder,
    dtype,
    lora: dict | None = None,
    checkpointing: bool = False,
    liger: bool = False,
    device: str = "cpu",
    **load_kw,
):
    """transformers' model from `folder` in `dtype` on `device`, as a user's script loads it:
    with Liger Kernel's Qwen2 kernels patched in (liger; inside `liger_patched()`), peft's
    adapters (lora: r, alpha, targets and optionally parameters, peft's target_parameters;
    dropout 0) and gradient checkpointing (non-reentrant). load_kw: from_pretrained's own
    (quantization_config, experts_implementation, ...)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **load_kw)
    if device != "cpu":
        model = model.to(device)
    if liger:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2

        apply_liger_kernel_to_qwen2(model=model)
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        lc = LoraConfig(
            r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=0.0,
            bias="none",
            target_modules=lora.get("targets", PEFT_TARGETS),
            target_parameters=lora.get("parameters"),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lc)
    if checkpointing:
        model.config.use_cache = False
        kw = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.2x's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    model.train()
    return model


@contextlib.contextmanager
def liger_patched():
    """Liger's Qwen2 patch replaces names in transformers' Qwen2 module for the whole process
    (RoPE, RMSNorm, the MLP, the causal LM's forward): put them back afterwards, so a plain
    transformers side later in the same process is plain."""
    from transformers.models.qwen2 import modeling_qwen2

    names = ("apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP")
    saved = {n: getattr(modeling_qwen2, n) for n in names}
    forward = modeling_qwen2.Qwen2ForCausalLM.forward
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(modeling_qwen2, name, value)
        modeling_qwen2.Qwen2ForCausalLM.forward = forward


def hf_optimizer(model):
    """Fused AdamW at 1e-4 over the trainable parameters, decay 0.1 on matrices only."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=1e-4, fused=True)


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def hf_step(model, opt, autocast=None, model_loss: bool = False):
    """One optimizer step of a transformers model on (x, y) -> the loss as a float (it syncs,
    as a script's logging does). The loss: one cross-entropy in fp32 over the logits; or,
    model_loss, the model's own from shift_labels (Liger's fused linear cross-entropy, which
    never makes the logits). autocast: a context to run the forward in (bf16 on a GPU)."""
    import torch.nn.functional as F

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with autocast if autocast is not None else contextlib.nullcontext():
            if model_loss:
                loss = model(input_ids=x, shift_labels=y).loss
            else:
                logits = model(input_ids=x).logits
        if not model_loss:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    return step
