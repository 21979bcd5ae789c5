"""An image LoRA step: TrainDeck against transformers + peft on the same small Gemma 3
composite (Gemma3ForConditionalGeneration built from transformers' config classes: a SigLIP
tower of 16 x 16 patches pooled into 64 image tokens, a 4-layer language model), CPU, fp32.

    python benchmarks/vision.py [--rounds 2] [--steps 5] [--batch 4] [--seq 192] [--rank 8]

Both sides: the same folder, the same token rows (an image's 64 tokens between its start and
end marks, then text), the same pixel values, LoRA of the same rank and alpha on the language
model's projections (dropout 0), the tower and projector frozen, the loss on the text tokens
only, AdamW. transformers' side: AutoModelForImageTextToText + peft (LoRA by a regex on the
language model's modules), token_type_ids marking the image tokens (its bidirectional image
attention, as TrainDeck's), one cross-entropy over the logits. Each side runs in a fresh
process, rounds alternating; only training steps are timed (warm-up excluded), medians.
Prints tokens/s, peak RSS (VmHWM) and its rise over the loaded model, and the ratios. Needs
the test extras (transformers, peft).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks import sides  # noqa: E402
from benchmarks.finetune import rss_mb  # noqa: E402

SIDE = 224  # 16 x 16 patches of 14, pooled 2 x 2 into 64 tokens
TOKENS = 64


def build(folder: Path) -> None:
    """A small Gemma 3 composite (about 9M parameters) and its processor files."""
    import torch
    import transformers as t
    from vision_models import gemma3_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tok = gemma3_tokenizer(folder)
    ids = {n: tok.convert_tokens_to_ids(n) for n in ("<start_of_image>", "<image_soft_token>")}
    text = t.Gemma3TextConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        query_pre_attn_scalar=64,
        sliding_window=512,
        max_position_embeddings=1024,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    vision = t.SiglipVisionConfig(
        hidden_size=192,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=3,
        image_size=SIDE,
        patch_size=14,
        vision_use_head=False,
    )
    config = t.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=TOKENS,
        image_token_id=ids["<image_soft_token>"],
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
    )
    torch.manual_seed(0)
    model = t.Gemma3ForConditionalGeneration(config).float()
    with torch.no_grad():  # the projector starts at zero: give the images a say
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.05)
    model.save_pretrained(folder)
    images = t.Gemma3ImageProcessorPil(
        size={"height": SIDE, "width": SIDE}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    t.Gemma3Processor(
        image_processor=images, tokenizer=tok, chat_template=tok.chat_template
    ).save_pretrained(folder)


def batches(folder: Path, n: int, batch: int, seq: int, seed: int = 0):
    """n (x, y, mask, pixels) batches, the same on both sides: each row one image's tokens
    between its marks after <bos>, random text after; mask 1 on text targets only."""
    import torch

    cfg = json.loads((folder / "config.json").read_text())
    image, start = cfg["image_token_index"], cfg["boi_token_index"]
    end = cfg["eoi_token_index"]
    plain = min(start, image, end, cfg["text_config"]["bos_token_id"])  # below the specials
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        rows = torch.randint(10, plain, (batch, seq + 1), generator=g)
        rows[:, 0] = cfg["text_config"]["bos_token_id"]
        rows[:, 1] = start
        rows[:, 2 : 2 + TOKENS] = image
        rows[:, 2 + TOKENS] = end
        x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        mask = ((x != image) & (y != image)).float()  # not the image's tokens, nor its end
        pixels = torch.rand(batch, 3, SIDE, SIDE, generator=g) * 2 - 1
        out.append((x, y, mask, pixels))
    return out


def traindeck_side(a):
    from core.models.lora import trainable_params
    from core.training import inputs
    from core.weights.loader import open_pretrained

    pre = open_pretrained(a.model)
    cfg = sides.pretrained_config(
        a.model,
        pre,
        batch_size=a.batch,
        grad_accum=1,
        seq_len=a.seq,
        device="cpu",
        precision="fp32",
        lr=1e-4,
        dropout=0.0,
        lora_rank=a.rank,
        lora_alpha=a.alpha,
        lora_dropout=0.0,
        lora_targets="all",
        base_bits="32",
    )
    model, opt = sides.traindeck_model(cfg, pre)
    inputs.attach_vision(model, pre, lambda line: None)
    import torch

    scaler = torch.amp.GradScaler("cuda", enabled=False)

    def step(x, y, mask, pixels):
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y, loss_mask=mask, images=pixels)
        loss.backward()
        opt.step(scaler)
        return loss.item()

    return step, trainable_params(model)


def peft_side(a):
    import torch
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    cfg = json.loads((Path(a.model) / "config.json").read_text())
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(a.model, dtype=torch.float32)
    targets = "|".join(sides.PEFT_TARGETS)
    lc = LoraConfig(
        r=a.rank,
        lora_alpha=a.alpha,
        lora_dropout=0.0,
        bias="none",
        target_modules=rf".*language_model.*\.({targets})",
    )
    model = get_peft_model(model, lc)  # everything else frozen: the tower and projector too
    model.train()
    opt = sides.hf_optimizer(model)
    image = cfg["image_token_index"]

    def step(x, y, mask, pixels):
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=x, pixel_values=pixels, token_type_ids=(x == image).long()).logits
        labels = y.masked_fill(mask == 0, -100)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    return step, sides.trainable(model)


def one_side(a) -> dict:
    import torch

    if a.side == "traindeck":
        from core.platform.device import flush_denormals

        flush_denormals()
        import core.training.trainer  # noqa: F401
    else:
        import peft  # noqa: F401
        import transformers  # noqa: F401
    torch.set_num_threads(a.threads)
    data = batches(Path(a.model), a.warmup + a.steps, a.batch, a.seq)
    step, trainable = (traindeck_side if a.side == "traindeck" else peft_side)(a)
    loaded = rss_mb()
    times, cpu, losses = [], [], []
    for i, b in enumerate(data):
        t0, c0 = time.perf_counter(), time.process_time()
        losses.append(step(*b))
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    ms = sorted(times)[len(times) // 2] * 1000
    # CPU seconds of the process: less moved than wall time by other jobs on a shared machine
    cpu_ms = sorted(cpu)[len(cpu) // 2] * 1000
    peak = rss_mb("VmHWM")
    return {
        "side": a.side,
        "trainable": trainable,
        "tokens_per_s": a.batch * a.seq / ms * 1000,
        "tokens_per_cpu_s": a.batch * a.seq / cpu_ms * 1000,
        "ms_per_step": ms,
        "peak_rss_mb": peak,
        "rise_mb": peak - loaded,
        "losses": losses,
    }


def run_side(a, side: str) -> dict:
    cmd = [sys.executable, __file__, "--one", side, "--model", a.model]
    for k in ("steps", "warmup", "batch", "seq", "rank", "alpha", "threads"):
        cmd += [f"--{k}", str(getattr(a, k))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{side} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="a Gemma 3 composite folder (default: built)")
    ap.add_argument("--one", choices=("traindeck", "peft"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        a.side = a.one
        print(json.dumps(one_side(a)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if a.model is None:
            a.model = str(Path(tmp) / "gemma3")
            build(Path(a.model))
        runs = {"traindeck": [], "peft": []}
        for r in range(a.rounds):
            for side in ("peft", "traindeck") if r % 2 else ("traindeck", "peft"):
                res = run_side(a, side)
                runs[side].append(res)
                print(
                    f"round {r + 1} {side:<9} {res['tokens_per_s']:7.0f} tok/s "
                    f"{res['tokens_per_cpu_s']:7.0f} tok/CPU-s "
                    f"{res['peak_rss_mb']:6.0f} MB peak (+{res['rise_mb']:.0f} MB over loaded) "
                    f"first loss {res['losses'][0]:.3f}",
                    flush=True,
                )
    med = {
        s: {
            k: median([r[k] for r in rs])
            for k in ("tokens_per_s", "tokens_per_cpu_s", "peak_rss_mb", "rise_mb")
        }
        for s, rs in runs.items()
    }
    td, hf = med["traindeck"], med["peft"]
    print(
        f"\nGemma 3 composite, image tokens {TOKENS} of {a.seq}, batch {a.batch}, LoRA rank "
        f"{a.rank}, CPU fp32, {a.threads} threads, medians of {a.rounds} rounds x {a.steps} steps"
    )
    print(
        f"trainable: traindeck {runs['traindeck'][0]['trainable']:,}, peft "
        f"{runs['peft'][0]['trainable']:,}"
    )
    print("| side | tokens/s | tokens/CPU-s | peak RSS MB | rise over loaded MB |")
    print("|---|---|---|---|---|")
    for s, m in med.items():
        print(
            f"| {s} | {m['tokens_per_s']:.0f} | {m['tokens_per_cpu_s']:.0f} | "
            f"{m['peak_rss_mb']:.0f} | {m['rise_mb']:.0f} |"
        )
    print(
        f"speed {td['tokens_per_s'] / hf['tokens_per_s']:.2f}x peft "
        f"({td['tokens_per_cpu_s'] / hf['tokens_per_cpu_s']:.2f}x per CPU-second), peak memory "
        f"{td['peak_rss_mb'] / hf['peak_rss_mb']:.2f}x, rise {td['rise_mb'] / hf['rise_mb']:.2f}x"
    )


if __name__ == "__main__":
    main()
