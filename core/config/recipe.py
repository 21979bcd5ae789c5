"""The defaults a new model trains with when the user sets only its shape: chosen by
measurement (docs/performance.md, "Time to quality"), in one place.

Learning rates follow the width: AdamW's peak lr falls as 1/width past REF_WIDTH (the
maximal-update rule for hidden matrices), while Muon's update is normalised per matrix, so
its lr stays put; the embeddings, head and norms it leaves to AdamW follow AdamW's rule.
"""

from __future__ import annotations

from core.config import methods
from core.config.spec import TrainConfig

REF_WIDTH = 256  # the width the constants below were measured around (and below it)
ADAMW_LR = 3e-3  # AdamW alone, at REF_WIDTH and below
MUON_LR = 0.02  # Muon's hidden matrices, with torch's "original" shape adjustment
MUON_ADAMW_LR = 6e-3  # the embeddings, head and norms next to Muon
# A pretrained start (when lr is not set), measured at REF_WIDTH (docs/performance.md,
# "Fine-tuning defaults"): the largest lr that forgot little, then 1/width as above, with
# floors at what peers ship for 1-8B models.
FINETUNE_FULL_LR, FINETUNE_FULL_FLOOR = 1e-4, 1e-5
FINETUNE_LORA_LR, FINETUNE_LORA_FLOOR = 5e-4, 1e-4


def width_factor(hidden_dim: int) -> float:
    return min(1.0, REF_WIDTH / hidden_dim)


def optimizer(cfg: TrainConfig) -> str:
    """adamw, adamw8bit or muon: what `auto` means for this run."""
    if cfg.optimizer != "auto":
        return cfg.optimizer
    new_model = cfg.init_from is None and not cfg.lora_rank
    return "muon" if new_model else "adamw"


def adamw_lr(cfg: TrainConfig) -> float:
    """Peak lr of the AdamW parameters (all of them, or with muon the non-matrix ones)."""
    if cfg.lr is not None:
        return cfg.lr
    if cfg.init_from is not None:
        return finetune_lr(cfg)
    base = MUON_ADAMW_LR if optimizer(cfg) == "muon" else ADAMW_LR
    return base * width_factor(cfg.hidden_dim)


def finetune_lr(cfg: TrainConfig) -> float:
    """A fine-tune's default: LoRA's adapters take a larger lr than all the weights do;
    times the method's factor (DPO: a tenth, core.config.methods.dpo)."""
    if cfg.lora_rank:
        lr = max(FINETUNE_LORA_FLOOR, FINETUNE_LORA_LR * width_factor(cfg.hidden_dim))
    else:
        lr = max(FINETUNE_FULL_FLOOR, FINETUNE_FULL_LR * width_factor(cfg.hidden_dim))
    return lr * methods.of(cfg).lr_factor


def base_bits(cfg: TrainConfig, sixteen: bool) -> int:
    """A LoRA run's frozen base: base_bits as asked, or auto: 16 when the run computes in 16
    bits on a GPU (sixteen), else 32."""
    if cfg.base_bits != "auto":
        return int(cfg.base_bits)
    return 16 if sixteen else 32


def muon_lr(cfg: TrainConfig) -> float:
    return cfg.muon_lr if cfg.muon_lr is not None else MUON_LR


def optimizer_line(cfg: TrainConfig) -> str:
    """One line for the log: what trains with what."""
    if optimizer(cfg) == "muon":
        return f"Muon lr {muon_lr(cfg):.3g} (hidden matrices), AdamW lr {adamw_lr(cfg):.3g}"
    if optimizer(cfg) == "adamw8bit":
        return f"AdamW (8-bit state) lr {adamw_lr(cfg):.3g}"
    return f"AdamW lr {adamw_lr(cfg):.3g}"
