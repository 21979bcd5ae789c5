"""Quantized GGUF exports against llama.cpp's own quantizer, on one trained model:

    python benchmarks/gguf_quants.py [--run RUN_DIR] [--steps N]

Without --run it trains a Llama-shaped model (hidden 256, 4 layers, BPE 2048 tokens) on the
embedded corpus for --steps steps. For each quant type it writes TrainDeck's export and runs
llama.cpp's quantizer (llama_model_quantize, what llama-quantize runs) on TrainDeck's f16
export, then prints file sizes, perplexity in llama.cpp of both files on the run's validation
windows, TrainDeck's own perplexity of the dequantized weights (the figure the export logs)
and the greedy continuation llama.cpp writes from each. Needs llama-cpp-python.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama_cpp  # noqa: E402

from core.config.spec import TrainConfig, validate  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.gguf_quality import dequantized_model, perplexity, validation_windows  # noqa: E402
from core.weights.loader import load  # noqa: E402

TYPES = ["f16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0"]
PROMPT = "def main("


def train(folder: Path, steps: int) -> Path:
    cfg = validate(
        TrainConfig(
            hidden_dim=256,
            n_layers=4,
            n_heads=4,
            seq_len=128,
            batch_size=8,
            max_steps=steps,
            tokenizer="bpe",
            vocab_size=2048,
            device="cpu",
            precision="fp32",
            eval_every=steps,
            ckpt_every=steps,
            sample_tokens=0,
            corpus_max_bytes=2_000_000,
        )
    )
    Trainer(cfg, folder).run()
    return folder


def llama_quantize(src: Path, dst: Path, quant: str) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant.upper()}")
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) == 0


def llama_cpp_figures(path: Path, windows) -> tuple[float, str]:
    """(perplexity over the windows, greedy text after PROMPT) in llama.cpp."""
    n = len(windows[0][0][0]) + 1
    llm = llama_cpp.Llama(str(path), n_ctx=n, logits_all=True, verbose=False)
    nll = count = 0.0
    for x, y, *_ in windows:
        ids = [*x[0].tolist(), int(y[0, -1])]
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids) - 1], dtype=np.float64)
        top = logits.max(1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))
        nll -= logp[np.arange(len(ids) - 1), ids[1:]].sum()
        count += len(ids) - 1
    text = llm(PROMPT, max_tokens=24, temperature=0.0)["choices"][0]["text"]
    return float(np.exp(nll / count)), text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", help="a run folder (default: train one)")
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gguf-quants-"))
    run = Path(args.run) if args.run else train(tmp / "run", args.steps)
    loaded = load(run)
    windows = validation_windows(loaded)
    f16 = export(run, "gguf", tmp / "f16", quant="f16", log=lambda m: None) / "model.gguf"
    print(f"model: {loaded.model.num_params():,} parameters; {len(windows)} validation windows")
    print(f"TrainDeck fp32 perplexity: {perplexity(loaded.model, windows):.4f}\n")
    head = "| type | TrainDeck MB | llama.cpp MB | size ratio | ppl TrainDeck file | "
    print(head + "ppl llama.cpp file | ppl ratio | ppl dequantized in TrainDeck |")
    print("|---|---|---|---|---|---|---|---|")
    texts = {}
    for quant in TYPES:
        ours = export(run, "gguf", tmp / f"ours-{quant}", quant=quant, log=lambda m: None)
        ours = ours / "model.gguf"
        theirs = tmp / f"{quant}-llama.gguf"
        if quant == "f16":
            theirs = f16
        else:
            llama_quantize(f16, theirs, quant)
        ppl_o, text_o = llama_cpp_figures(ours, windows)
        ppl_t, text_t = llama_cpp_figures(theirs, windows)
        deq = perplexity(dequantized_model(loaded, ours), windows)
        mb_o, mb_t = ours.stat().st_size / 1e6, theirs.stat().st_size / 1e6
        print(
            f"| {quant} | {mb_o:.3f} | {mb_t:.3f} | {mb_o / mb_t:.3f} | {ppl_o:.4f} | "
            f"{ppl_t:.4f} | {ppl_o / ppl_t:.4f} | {deq:.4f} |"
        )
        texts[quant] = (text_o, text_t)
    print("\ngreedy continuations of", repr(PROMPT), "(TrainDeck file / llama.cpp file):")
    for quant, (a, b) in texts.items():
        print(f"  {quant:7s} {a!r}\n  {'':7s} {b!r}")


if __name__ == "__main__":
    main()
