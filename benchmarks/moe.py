"""One LoRA training step of a mixture of experts, TrainDeck against transformers + peft:

    python benchmarks/moe.py [--shape 0.5b|tiny] [--sides td,hf,hf-eager] [--experts]
        [--steps 3] [--warmup 1] [--batch 2] [--seq 128] [--threads 2] [--rank 8]

Builds a random Qwen3-MoE from transformers' own config class (0.5b: about 0.5B parameters,
8 experts, 2 a token, 8 layers; a 4096-token BPE tokenizer, the config's 32k vocabulary) in a
temporary folder, then times one LoRA training step (rank 8 on the attention projections,
with --experts also on every expert's projections: TrainDeck's --lora-experts, peft's
target_parameters) in a fresh process per side, so each peak RSS is its own:

- td: TrainDeck's model as a run builds it (grouped products, fused loss, AdamW);
- hf: transformers' model with its default experts implementation (grouped_mm in 5.24) and
  peft's adapters, AdamW, plain cross-entropy;
- hf-eager: the same with experts_implementation="eager" (a loop over the experts).

CPU, fp32, the same token batches on every side, warm-up steps excluded, medians. Prints
tokens/s (wall and per CPU second: the CPU time moves less when other jobs share the
machine), peak RSS, and for TrainDeck the share of the step in the experts' grouped products
(forward and backward, base and adapters) and in the routing (the MoE blocks' forward
outside the products: router, softmax, top-k, sorting, gathering, statistics, activation
and the weighted sum).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from finetune import (
    hf_step,  # noqa: E402
    rss_mb,  # noqa: E402
    start_side,  # noqa: E402
)

SHAPES = {
    # 32k x 1024 embeddings and head (66M), 8 layers of attention (25M) and 8 x 3 x 1024 x
    # 2048 experts (403M): 0.49B total, about 0.19B active a token
    "0.5b": dict(
        hidden_size=1024,
        intermediate_size=4096,
        moe_intermediate_size=2048,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=64,
        vocab_size=32000,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=8192,
        max_position_embeddings=256,
    ),
}


def build_model(folder: Path, shape: dict) -> None:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from core.data.build_text import read_blocks as _read_blocks
    from core.data.sources import _stdlib_files
    from core.data.tokenizer import train_bpe

    text = b"".join(_read_blocks(_stdlib_files(), 500_000))
    hf = train_bpe([text], 4096).hf
    hf.add_special_tokens(["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=hf, eos_token="<|endoftext|>")
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(eos_token_id=tok.eos_token_id, initializer_range=0.02, **shape)
    with torch.device("cpu"):
        Qwen3MoeForCausalLM(cfg).save_pretrained(folder)


def batches(n: int, batch: int, seq: int, vocab: int):
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        w = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        out.append((w[:, :-1].contiguous(), w[:, 1:].contiguous()))
    return out


def traindeck_side(a):
    import torch

    from core.config.spec import TrainConfig, validate
    from core.models.lora import trainable_params
    from core.training import inputs, optim, planner
    from core.weights.loader import apply_pretrained, open_pretrained

    cfg = TrainConfig(
        init_from=a.model,
        batch_size=a.batch,
        seq_len=a.seq,
        device="cpu",
        precision="fp32",
        lr=1e-4,
        dropout=0.0,
        tokenizer="model",
        lora_rank=a.rank,
        lora_alpha=2.0 * a.rank,
        lora_targets="attn",
        lora_experts=a.experts,
        base_bits="32",
    )
    pre = open_pretrained(a.model)
    cfg = validate(apply_pretrained(validate(cfg), pre))
    # the heap, as a run's setup sets it
    inputs.set_switches(cfg, torch.device("cpu"), planner.heap_choice(cfg).lean)
    torch.manual_seed(0)
    model = inputs.build_model(cfg, pre, torch.device("cpu"), "fp32", lambda m: None)
    model.train()
    opt = optim.make(model, cfg)
    scaler = torch.amp.GradScaler("cuda", enabled=False)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        opt.step(scaler)
        return loss.item()

    return step, trainable_params(model)


def peft_side(a):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    kw = {"experts_implementation": "eager"} if a.side == "hf-eager" else {}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, **kw)
    experts = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"] if a.experts else None
    lc = LoraConfig(
        r=a.rank,
        lora_alpha=2 * a.rank,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        target_parameters=experts,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lc)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1)

    return hf_step(model, opt), sum(p.numel() for p in params)


def shares(step, x, y) -> dict:
    """TrainDeck's step under the profiler, as shares of its CPU time: the experts' grouped
    products (aten::_grouped_mm's total: on the CPU one aten::mm per group; forward and
    backward, base and adapters), and the rest of the MoE blocks' forward (the routing:
    router, softmax, top-k, sorting and gathering the tokens by expert, the statistics; and
    the activation and the weighted sum of the top-k outputs)."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    from core.models import lora, moe

    forward, matmul = moe.MoE.forward, moe.expert_matmul

    def timed_forward(self, *args, **kw):
        with record_function("moe_block"):
            return forward(self, *args, **kw)

    def timed_matmul(*args, **kw):
        with record_function("moe_products"):
            return matmul(*args, **kw)

    moe.MoE.forward, moe.expert_matmul, lora.expert_matmul = (
        timed_forward,
        timed_matmul,
        timed_matmul,
    )
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(x, y)
    finally:
        moe.MoE.forward, moe.expert_matmul, lora.expert_matmul = forward, matmul, matmul
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    grouped = sum(e.cpu_time_total for e in events if e.key == "aten::_grouped_mm")
    scope = {e.key: e.cpu_time_total for e in events if e.key.startswith("moe_")}
    rest = scope.get("moe_block", 0) - scope.get("moe_products", 0)
    return {"expert_products_share": grouped / total, "routing_share": rest / total}


def one_side(a) -> dict:
    start_side(a.side == "td", a.threads)
    step, trainable = (traindeck_side if a.side == "td" else peft_side)(a)
    loaded_mb = rss_mb()
    vocab = json.loads((Path(a.model) / "config.json").read_text())["vocab_size"]
    times, cpu = [], []
    data = batches(a.warmup + a.steps, a.batch, a.seq, vocab)
    for i, (x, y) in enumerate(data):
        t0, c0 = time.perf_counter(), time.process_time()
        step(x, y)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    tokens = a.batch * a.seq
    out = {
        "side": a.side,
        "trainable": trainable,
        "loaded_mb": loaded_mb,
        "tokens_per_s": tokens / median(times),
        "tokens_per_cpu_s": tokens / median(cpu),
        "peak_rss_mb": rss_mb("VmHWM"),
    }
    if a.side == "td":
        out.update(shares(step, *data[-1]))
    return out


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def run_side(a, folder: Path, side: str) -> dict:
    cmd = [sys.executable, __file__, "--one-side", side, "--model", str(folder)]
    for name in ("steps", "warmup", "threads", "batch", "seq", "rank"):
        cmd += [f"--{name}", str(getattr(a, name))]
    cmd += ["--experts"] if a.experts else []
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"side": side, "error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=list(SHAPES), default="0.5b")
    p.add_argument("--sides", default="td,hf,hf-eager")
    p.add_argument("--experts", action="store_true", help="LoRA on every expert too")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--model", help="an existing model folder (default: build one)")
    p.add_argument("--one-side", dest="side", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.side:
        print(json.dumps(one_side(a)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(a.model or tmp)
        if not a.model:
            build_model(folder, SHAPES[a.shape])
        results = [run_side(a, folder, side) for side in a.sides.split(",")]
    what = "attention + experts" if a.experts else "attention"
    print(f"LoRA rank {a.rank} on {a.shape} ({what}), batch {a.batch} x {a.seq}, fp32 CPU, ")
    print(f"{a.threads} threads, median of {a.steps} steps after {a.warmup} warm-up")
    base = next((r for r in results if r["side"] == "hf" and "error" not in r), None)
    for r in results:
        if "error" in r:
            print(f"{r['side']:9} error: {r['error']}")
            continue
        line = (
            f"{r['side']:9} {r['tokens_per_s']:8.1f} tok/s  {r['tokens_per_cpu_s']:8.1f} "
            f"tok/CPU-s  peak {r['peak_rss_mb']:7.0f} MB  trainable {r['trainable']:,}"
        )
        if base is not None and r is not base:
            line += f"  x{r['tokens_per_cpu_s'] / base['tokens_per_cpu_s']:.2f} of hf per CPU-s"
        print(line)
        if "expert_products_share" in r:
            print(
                f"          step time: expert products {r['expert_products_share']:.0%}, "
                f"routing and the rest of the MoE forward {r['routing_share']:.0%}"
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
