"""The planner: what to run with, from the memory estimate (core.training.estimate). The
longest context that fits, the largest micro-batch that fits, Fit to my GPU (the fit ladder),
the recommended preset, and the C heap a CPU run keeps (core.platform.heap) with what each heap
holds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from core.config import recipe
from core.config.spec import LIMITS, TrainConfig
from core.errors import ConfigError
from core.platform import heap
from core.training.estimate import (
    GB,
    checkpointed,
    estimate,
    fits,
    model_shape,
    offloaded,
    usable_bytes,
)

CONTEXT_STEP = 256  # the longest context is given in whole steps of this many tokens


def context_cap(cfg: TrainConfig) -> int:
    """The longest seq_len a config may ask for: the field's limit, and a pretrained model's
    own context."""
    cap = int(LIMITS["seq_len"][2])
    return min(cap, model_shape(cfg).seq_len) if cfg.init_from else cap


def need(cfg: TrainConfig, processes: int = 1, on_gpu: bool = True) -> int:
    """Device bytes cfg needs on one card: the whole run's, or one sharded process's of
    `processes` (core.training.sharding.rank_estimate)."""
    est = estimate(cfg, on_gpu=on_gpu)
    if processes > 1:
        from core.training.sharding import rank_estimate

        est = rank_estimate(est, cfg, processes)
    return est.device_total


def fits_on(cfg: TrainConfig, free_bytes: int, processes: int = 1) -> bool:
    return need(cfg, processes) <= usable_bytes(free_bytes)


def longest_context(
    cfg: TrainConfig, budget_bytes: int, on_gpu: bool = True, processes: int = 1
) -> int:
    """The longest seq_len at which cfg (its method, batch, checkpointing, LoRA and base bits as
    they are) needs at most budget_bytes (device_total: usable_bytes of what is free), in whole
    CONTEXT_STEPs when one fits; 0 when not even the shortest context fits."""

    def fits_at(seq_len: int) -> bool:
        probe = dataclasses.replace(cfg, seq_len=seq_len)
        return need(probe, processes, on_gpu) <= budget_bytes

    cap = context_cap(cfg)
    low = int(LIMITS["seq_len"][1])
    if not fits_at(low):
        return 0
    if fits_at(cap):
        return cap
    good, bad = low, cap  # the estimate grows with seq_len: bisect between the two
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits_at(mid) else (good, mid)
    return good // CONTEXT_STEP * CONTEXT_STEP if good >= CONTEXT_STEP else good


def context_line(cfg: TrainConfig, free_bytes: int, on_gpu: bool) -> tuple[str, bool]:
    """The longest context that fits what is free, in words for the window and the CLI, and
    whether cfg's own seq_len is past it (a warning)."""
    where = "on this GPU" if on_gpu else f"in {free_bytes / GB:.0f} GiB of free RAM"
    longest = longest_context(cfg, usable_bytes(free_bytes), on_gpu)
    if not longest:
        return f"no context fits {where} at this batch and method", True
    capped = " (the model's own limit)" if cfg.init_from and longest == context_cap(cfg) else ""
    line = f"fits up to {longest:,} tokens {where}{capped}"
    if cfg.seq_len <= longest:
        return line, False
    need = estimate(cfg, on_gpu=on_gpu).device_total
    return f"{cfg.seq_len:,} will NOT fit ({need / GB:.1f} GiB needed); {line}", True


def fit_micro_batch(cfg: TrainConfig, free_bytes: int, processes: int = 1) -> TrainConfig | None:
    """The largest micro-batch that fits (each sharded process's, over `processes`), with
    grad_accum set to keep the effective batch.

    None when not even a micro-batch of 1 fits.
    """
    total = cfg.batch_size * cfg.grad_accum
    for micro in range(total, 0, -1):
        if total % micro:
            continue
        candidate = dataclasses.replace(cfg, batch_size=micro, grad_accum=total // micro)
        if fits_on(candidate, free_bytes, processes):
            return candidate
    return None


LORA_FIT_RANK = 16  # the rank "Fit to my GPU" picks when full fine-tuning does not fit


def fine_tune_choices(cfg: TrainConfig) -> tuple[TrainConfig, TrainConfig]:
    """The two ways to fine-tune a config: full, and LoRA (its rank, else LORA_FIT_RANK)
    with activation checkpointing."""
    full = dataclasses.replace(cfg, lora_rank=0, lora_alpha=None)
    low = dataclasses.replace(
        cfg, lora_rank=cfg.lora_rank or LORA_FIT_RANK, grad_checkpointing=True
    )
    return full, low


def ladder(cfg: TrainConfig) -> list[tuple[str, TrainConfig]]:
    """The ways to fine-tune a pretrained model, from the most memory to the least: full
    with AdamW, full with 8-bit AdamW, LoRA on a 16-bit base, QLoRA (a 4-bit base); each
    first as it is, then with activation checkpointing (a third more compute a step), and
    LoRA's then with the checkpoints offloaded to pinned RAM (CUDA: the copies overlap
    compute)."""
    full, low = fine_tune_choices(cfg)
    full = dataclasses.replace(full, optimizer="adamw", base_bits="auto")
    eight = dataclasses.replace(full, optimizer="adamw8bit")
    lora_opt = "adamw" if low.optimizer == "muon" else low.optimizer
    sixteen = dataclasses.replace(
        low, base_bits="16" if low.base_bits == "16" else "auto", optimizer=lora_opt
    )
    four = dataclasses.replace(sixteen, base_bits="4")
    rank = low.lora_rank
    methods = [
        ("full fine-tuning (AdamW)", full),
        ("full fine-tuning (8-bit AdamW)", eight),
        (f"LoRA rank {rank} (16-bit base)", sixteen),
        (f"QLoRA: LoRA rank {rank} on a 4-bit base", four),
    ]
    out, shape = [], model_shape(cfg)
    for name, rung in methods:
        plain = dataclasses.replace(rung, grad_checkpointing=False, offload_checkpoints=False)
        ckpt = dataclasses.replace(plain, grad_checkpointing=True)
        out += [(name, plain), (f"{name} with activation checkpointing", ckpt)]
        away = dataclasses.replace(ckpt, offload_checkpoints=True)
        # at long context the block inputs are what is left: offered where the model
        # offloads them (core.models.offload.offloads)
        if rung.lora_rank and offloaded(away, shape):
            out.append((f"{name} + checkpointing offloaded to RAM", away))
    return out


@dataclass
class Rung:
    """One way to fine-tune, judged against free memory."""

    name: str
    config: TrainConfig
    need_at_one: int  # device bytes at a micro-batch of 1 (a sharded rung: per card)
    fitted: TrainConfig | None  # at its largest micro-batch that fits; None: does not fit
    need: int = 0  # device bytes of fitted
    chosen: bool = False
    longest: int = 0  # the longest context it fits at a micro-batch of 1 (0: none)
    processes: int = 1  # a sharded rung: the GPUs (torchrun processes) it is split over


def card_ladder(cfg: TrainConfig, gpus: int) -> list[tuple[str, TrainConfig]]:
    """The ladder on `gpus` cards: each method on one card, then (gpus > 1) the same method
    sharded over them (FSDP2, --shard under torchrun) before the next method, so a method
    that fits two cards comes before a leaner one that fits one. A sharded process takes
    its share of the effective batch (the whole batch each where gpus does not divide it).
    8-bit AdamW and offloaded checkpoints are not offered sharded."""
    total = cfg.batch_size * cfg.grad_accum
    each = total // gpus if total % gpus == 0 else total
    out: list[tuple[str, TrainConfig]] = []
    group: list[tuple[str, TrainConfig]] = []

    def sharded() -> list[tuple[str, TrainConfig]]:
        return [
            (
                f"{name}, sharded over {gpus} GPUs",
                dataclasses.replace(r, shard=True, batch_size=each, grad_accum=1),
            )
            for name, r in group
            if gpus > 1 and r.optimizer != "adamw8bit" and not r.offload_checkpoints
        ]

    for name, rung in ladder(cfg):
        rung = dataclasses.replace(rung, shard=False)
        if not rung.grad_checkpointing and group:  # a method's first rung: the last is done
            out += sharded()
            group = []
        group.append((name, rung))
        out.append((name, rung))
    return out + sharded()


def walk_ladder(cfg: TrainConfig, free_bytes: int, gpus: int = 1) -> list[Rung]:
    """Every rung of the ladder with its need; the first that fits is chosen (the ones
    below it are still judged, for the window's table). With gpus > 1 (each with free_bytes
    free) each method's rungs sharded over them follow its one-card ones, judged by each
    card's share (card_ladder)."""
    rungs, found = [], False
    for name, rung in card_ladder(cfg, gpus):
        n = gpus if rung.shard else 1
        one = dataclasses.replace(rung, batch_size=1, grad_accum=1)
        fitted = fit_micro_batch(rung, free_bytes, n)
        if fitted is not None:
            fitted = fewest_checkpointed(fitted, free_bytes, n)
        needed = need(fitted, n) if fitted else 0
        longest = longest_context(one, usable_bytes(free_bytes), processes=n)
        rungs.append(Rung(name, rung, need(one, n), fitted, needed, longest=longest, processes=n))
        if fitted is not None and not found:
            rungs[-1].chosen = found = True
    return rungs


def auto_shard(cfg: TrainConfig, processes: int, free_bytes: int) -> str | None:
    """Why a run under torchrun over `processes` cards (free_bytes free on each) shards
    (--shard) without being asked: the estimate says the whole model does not fit one card
    but each process's share does. None: DDP's whole copy a card fits, or sharding does not
    help either (the run goes on as asked, and the memory check says so)."""
    if cfg.shard or processes < 2 or fits_on(cfg, free_bytes):
        return None
    if (cfg.lora_rank and cfg.base_bits == "8") or not fits_on(
        dataclasses.replace(cfg, shard=True), free_bytes, processes
    ):
        return None
    return (
        f"sharding over {processes} processes (--shard): the whole model needs "
        f"{need(cfg) / GB:.1f} GiB a card, more than the {usable_bytes(free_bytes) / GB:.1f} "
        f"usable; each process's share {need(cfg, processes) / GB:.1f} GiB"
    )


def fewest_checkpointed(cfg: TrainConfig, free_bytes: int, processes: int = 1) -> TrainConfig:
    """Under gradient checkpointing (every block, not offloaded), the fewest checkpointed
    blocks that still fit at cfg's batch: each block left out is one less recomputed in
    backward. cfg itself where none can be left out."""
    layers = model_shape(cfg).n_layers
    if not cfg.grad_checkpointing or offloaded(cfg):  # an offloading model takes them all
        return cfg
    for k in range(1, layers):  # memory falls as k grows: the first that fits is the fewest
        fewer = dataclasses.replace(cfg, checkpoint_blocks=k)
        if fits_on(fewer, free_bytes, processes):
            return fewer
    return cfg


def checkpoint_line(cfg: TrainConfig, on_gpu: bool = True) -> str:
    """'k of L blocks checkpointed' (empty without checkpointing), for the ladder and the
    window."""
    if not cfg.grad_checkpointing:
        return ""
    c = model_shape(cfg)
    return f"{checkpointed(cfg, c, on_gpu)} of {c.n_layers} blocks checkpointed"


def fit_pretrained(
    cfg: TrainConfig, free_bytes: int, rungs: list[Rung] | None = None, gpus: int = 1
):
    """The first rung of the ladder that fits, at its largest micro-batch (the effective
    batch kept). Returns (config or None, every rung's need at batch 1 and what was chosen);
    rungs: walk_ladder's answer when the caller has it already; gpus: the cards a run may
    shard over (each with free_bytes free)."""
    usable = usable_bytes(free_bytes) / GB
    rungs = rungs if rungs is not None else walk_ladder(cfg, free_bytes, gpus)
    needs = [f"{r.name} {r.need_at_one / GB:.1f} GiB" for r in rungs]
    for i, r in enumerate(rungs):
        if r.chosen:
            f = r.fitted
            card = " per GPU" if r.processes > 1 else ""
            chosen = (
                f"{r.name} fits ({r.need / GB:.1f} of {usable:.1f} GiB usable{card}): batch "
                f"{f.batch_size} x {f.grad_accum}"
            )
            if r.processes > 1:
                chosen += (
                    " a process; run torchrun --standalone --nproc_per_node "
                    f"{r.processes} -m core.train ... --shard"
                )
            if ckpt := checkpoint_line(f):
                chosen = f"{chosen}, {ckpt}"
            if i:
                chosen = f"{chosen}; at batch 1 " + ", ".join(needs[:i]) + " do not fit"
            return f, chosen
    best = max(rungs, key=lambda r: r.longest, default=None)
    shorter = "lower seq_len"
    if best is not None and best.longest:
        shorter = f"lower seq_len to {best.longest:,} or less ({best.name})"
    return None, (
        f"none fits {usable:.1f} GiB usable at seq_len {cfg.seq_len:,}; at batch 1: "
        f"{'; '.join(needs)}; {shorter}, or pick a smaller model"
    )


def next_rung(cfg: TrainConfig) -> str | None:
    """The ladder's rung below the one cfg is on (what to try when memory runs short)."""
    names = [(n, r) for n, r in ladder(cfg)]
    key = _rung_key(cfg)
    for i, (_, rung) in enumerate(names):
        if _rung_key(rung) == key and i + 1 < len(names):
            return names[i + 1][0]
    return None


def _rung_key(cfg: TrainConfig) -> tuple:
    sixteen = cfg.base_bits in ("auto", "16", "32")
    opt = recipe.optimizer(cfg) if not cfg.lora_rank else "adamw"
    ckpt, offloaded = bool(cfg.grad_checkpointing), bool(cfg.offload_checkpoints)
    return (bool(cfg.lora_rank), opt, sixteen, ckpt, offloaded)


# A card sold as T GB shows about T GiB; the driver, the desktop and other programs hold some
# of it, so a tier counts as reached when 90% of T GiB is free.
TIER_SLACK = 0.90


def reaches_tier(tier_gb: int, free_bytes: int) -> bool:
    return tier_gb * GB * TIER_SLACK <= free_bytes


def recommend_preset(total_bytes: int | None = None, free_bytes: int | None = None, presets=None):
    """The largest VRAM tier preset at or below the free VRAM (whose estimate fits it); on a
    card under the smallest tier, the largest seed-table GPU preset that suits it.

    With no GPU (total_bytes None after detection) the CPU preset is recommended.
    """
    from core.config import presets as preset_lib

    presets = presets if presets is not None else preset_lib.list_presets()
    if total_bytes is None:
        from core.platform.hardware import gpus

        found = gpus()
        if found:
            total_bytes = found[0]["total_bytes"]
            free_bytes = found[0]["free_bytes"]
    if total_bytes is None:
        cpu = [p for p in presets if p.name == "cpu"] or [p for p in presets if not p.for_gpu]
        return cpu[0]
    free = free_bytes if free_bytes is not None else total_bytes
    tiered = sorted((p for p in presets if p.tier_gb), key=lambda p: p.tier_gb, reverse=True)
    for p in tiered:
        if reaches_tier(p.tier_gb, free) and fits(preset_lib.to_config(p), free):
            return p
    seed = [p for p in presets if p.for_gpu and not p.tier_gb] or tiered
    gpu = sorted(seed, key=lambda p: p.min_vram_gb or 0, reverse=True)
    for p in gpu:
        if (p.min_vram_gb or 0) * GB * 0.95 <= total_bytes and fits(preset_lib.to_config(p), free):
            return p
    return gpu[-1]


def recommendation_line(preset, free_bytes: int | None) -> str:
    """Why this preset is recommended, in one line for the window and the CLI."""
    free = f"{free_bytes / GB:.1f} GiB free" if free_bytes is not None else "free VRAM unknown"
    if preset.tier_gb:
        return (
            f"recommended: {preset.name}, the largest VRAM tier at or below the {free} "
            f"(a {preset.tier_gb} GB tier needs {preset.tier_gb * TIER_SLACK:.1f} GiB free)"
        )
    if preset.for_gpu:
        return f"recommended: {preset.name}; {free} is under the smallest VRAM tier"
    return f"recommended: {preset.name} (no CUDA GPU)"


def heap_choice(
    cfg: TrainConfig, room: heap.Room | None = None, peak: int | None = None
) -> heap.Choice:
    """The C heap a CPU run of cfg keeps (core.platform.heap.choose), and why: by its
    estimated peak (peak: the CPU estimate's device_total where the caller has it) against
    room (default: what this process may use now)."""
    if peak is None:
        try:
            peak = estimate(cfg, on_gpu=False).device_total
        except (OSError, ValueError):  # a start the estimate cannot read: stay lean
            peak = None
    return heap.choose(peak, room if room is not None else heap.room())


def heap_line(cfg: TrainConfig, room: heap.Room | None = None, peak: int | None = None) -> str:
    """Which heap the CPU estimate describes, and what the heap a run of cfg takes here (by
    TRAINDECK_HEAP; auto, the default, by heap_choice) will hold: for the window's Details
    and --estimate."""
    peak = peak if peak is not None else estimate(cfg, on_gpu=False).device_total
    try:
        choice = heap_choice(cfg, room, peak)
    except ConfigError as e:  # a TRAINDECK_HEAP it does not know: a run refuses it, so say so
        return f"The CPU estimate is for the lean C heap. {e}"
    line = f"The CPU estimate is for the lean C heap. A run here takes the {choice.name} heap"
    line += f" ({choice.why})"
    if choice.lean:
        return f"{line}: about {peak / GB:.2f} GiB at its peak."
    return (
        f"{line}, which may hold up to {heap.FAST_HOLDS:g}x the estimate: about "
        f"{heap.FAST_HOLDS * peak / GB:.2f} GiB (TRAINDECK_HEAP=lean holds the estimate, "
        "steps up to 45% slower)."
    )
