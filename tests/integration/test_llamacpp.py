"""GGUF exports proven in llama.cpp itself (llama-cpp-python): the same token ids, logits
within llama.cpp's arithmetic, the same greedy continuation. llama-cpp-python builds from
source (about 20 minutes on 2 cores), so these tests run where it is installed and skip
elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import llama_greedy, tiny_config

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")

from hf_models import FAMILIES, GPT_OSS_CONFIG, TEXT, make_model  # noqa: E402

from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.generate import generate_ids, prompt_ids  # noqa: E402
from core.use.gguf_quality import dequantized_model  # noqa: E402
from core.weights.loader import load  # noqa: E402


def llama_cpp_agrees(target, out, prompt: str, n_new: int = 12):
    loaded = load(target)
    export(target, "gguf", out, quant="f32")
    ids = prompt_ids(loaded.tokenizer, prompt)
    llm = llama_cpp.Llama(
        str(out / "model.gguf"),
        n_ctx=loaded.model.config.seq_len,
        logits_all=True,
        n_threads=1,
        verbose=False,
    )
    assert llm.tokenize(prompt.encode(), add_bos=True, special=False) == ids
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)])
    with torch.no_grad():
        ours = loaded.model.logits(torch.tensor([ids]))[0].numpy()
    # llama.cpp computes attention with its own kernels: close, not bit-equal
    assert np.abs(theirs - ours).max() < 0.05 * max(1.0, np.abs(ours).std())
    expected = list(generate_ids(loaded.model, ids, n_new, temperature=0))
    got = llama_greedy(llm, ids, n_new)
    assert got == expected
    return llm


NEW_MODELS = {  # llama.cpp architecture: (arch, extra settings)
    "gpt2": ("gpt2", {}),
    "llama": ("llama", {"n_heads": 4, "n_kv_heads": 2}),
    "qwen3": ("llama", {"n_heads": 4, "n_kv_heads": 2, "qk_norm": True}),
}


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
@pytest.mark.parametrize("family", list(NEW_MODELS))
def test_new_model_gguf_runs_in_llama_cpp(tmp_path, family, tokenizer):
    arch, extra = NEW_MODELS[family]
    data = tmp_path / "code.txt"
    data.write_text(TEXT * 20, encoding="utf-8")
    cfg = tiny_config(
        data=str(data),
        arch=arch,
        tokenizer=tokenizer,
        vocab_size=512,
        max_steps=20,
        seq_len=48,
        dropout=0.0,
        sample_tokens=0,
        **extra,
    )
    Trainer(cfg, tmp_path / "run").run()
    llm = llama_cpp_agrees(tmp_path / "run", tmp_path / "gguf", "def add(a")
    assert llm.metadata["general.architecture"] == family


@pytest.mark.parametrize("family", [*FAMILIES, "llama2"])  # llama2: a SentencePiece tokenizer
def test_pretrained_family_gguf_runs_in_llama_cpp(tmp_path, family):
    make_model(tmp_path / "model", family)
    llm = llama_cpp_agrees(tmp_path / "model", tmp_path / "gguf", "def add(a, b): hello world")
    if family != "gpt2":  # the chat template travels in the file's metadata
        assert llm.metadata.get("tokenizer.chat_template")


@pytest.mark.parametrize("family", ["qwen2", "smollm3"])
def test_yarn_rope_scaling_gguf_runs_in_llama_cpp(tmp_path, family):
    """YaRN (Qwen2.5's and SmolLM3's long-context setting) as llama.cpp reads it, on a text
    past the original context."""
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    make_model(tmp_path / "model", family, rope_scaling=yarn)
    prompt = "def add(a, b): hello world 12 The quick brown fox"
    llm = llama_cpp_agrees(tmp_path / "model", tmp_path / "gguf", prompt)
    assert llm.metadata["general.architecture"] == family


# Each MoE family's tiny model in the shape its llama.cpp architecture runs: experts in every
# layer (llama.cpp's qwen2moe and qwen3moe have no dense layers), OLMoE without GQA or
# clip_qkv, gpt-oss's SwiGLU clamped where llama.cpp clamps it; the export refuses the rest.
MOE_AS_LLAMA_CPP = {
    "qwen3_moe": {"mlp_only_layers": []},
    "qwen2_moe": {"decoder_sparse_step": 1},
    "mixtral": {},
    "olmoe": {"num_key_value_heads": 4, "clip_qkv": None},  # as llama.cpp's olmoe runs
    "qwen3_5_moe": {},  # hybrid layers too: qwen35moe
    "gpt_oss": {
        "swiglu_limit": 7.0,
        # llama.cpp's YaRN rounds its ramp's ends (truncate), which gpt-oss's config turns off
        "rope_parameters": {**GPT_OSS_CONFIG["rope_parameters"], "truncate": True},
    },
}


def log_likelihoods(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    """log p(ids[t + 1] | ids[:t + 1]) from each position's logits."""
    x = np.asarray(logits[: len(ids) - 1], dtype=np.float64)
    top = x.max(1, keepdims=True)
    logp = x - top - np.log(np.exp(x - top).sum(1, keepdims=True))
    return logp[np.arange(len(ids) - 1), ids[1:]]


@pytest.mark.parametrize("family", list(MOE_AS_LLAMA_CPP))
def test_moe_gguf_log_likelihoods_match_transformers(tmp_path, family):
    """llama.cpp's stacked experts (ffn_gate_inp, ffn_{gate,up,down}_exps, shared expert,
    biases, sinks) as TrainDeck writes them score a text as transformers does."""
    hf, tok = make_model(tmp_path / "model", family, **MOE_AS_LLAMA_CPP[family])
    export(tmp_path / "model", "gguf", tmp_path / "gguf", quant="f32")
    ids = tok("def add(a, b): hello world 12 The quick brown fox")["input_ids"]
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].numpy()
    llm = llama_cpp.Llama(
        str(tmp_path / "gguf" / "model.gguf"),
        n_ctx=64,
        logits_all=True,
        n_threads=1,
        type_k=0,  # an f32 KV cache: llama.cpp's default f16 one alone moves them ~1e-3
        type_v=0,
        verbose=False,
    )
    llm.eval(ids)
    ours = log_likelihoods(np.array(llm.scores[: len(ids)]), ids)
    diff = np.abs(ours - log_likelihoods(theirs, ids)).max()
    assert diff < 2e-3, diff
    assert llm.metadata[f"{llm.metadata['general.architecture']}.expert_count"]


# -- quantized exports against llama.cpp's own quantizer ----------------------------------

QUANT_FTYPES = {
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
}


def llama_quantize(src, dst, quant: str) -> None:
    """llama.cpp's own quantizer (what llama-quantize runs) on src, an f16 GGUF."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANT_FTYPES[quant])
    params.nthread = 1
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) == 0


def llama_cpp_perplexity(path, windows) -> float:
    """Perplexity of a GGUF file in llama.cpp over token windows (each scored from its start)."""
    llm = llama_cpp.Llama(
        str(path), n_ctx=len(windows[0]), logits_all=True, n_threads=1, verbose=False
    )
    nll = count = 0.0
    for ids in windows:
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids) - 1], dtype=np.float64)
        top = logits.max(1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))
        nll -= logp[np.arange(len(ids) - 1), ids[1:]].sum()
        count += len(ids) - 1
    return float(np.exp(nll / count))


def tensor_types(path) -> dict[str, str]:
    import gguf

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


@pytest.fixture(scope="module")
def quant_run(tmp_path_factory):
    """A model wide enough for K-quant blocks (256 columns), trained a little."""
    base = tmp_path_factory.mktemp("quant")
    data = base / "code.txt"
    data.write_text(TEXT * 40, encoding="utf-8")
    cfg = tiny_config(
        data=str(data),
        hidden_dim=256,
        n_heads=4,
        n_layers=2,
        seq_len=64,
        max_steps=60,
        dropout=0.0,
        sample_tokens=0,
    )
    Trainer(cfg, base / "run").run()
    f16 = export(base / "run", "gguf", base / "f16", quant="f16")
    ids = load(base / "run").tokenizer.encode(TEXT * 3)
    windows = [ids[i : i + 64] for i in range(0, len(ids) - 64, 64)][:8]
    return base / "run", f16 / "model.gguf", windows


@pytest.mark.parametrize("quant", list(QUANT_FTYPES))
def test_quantized_gguf_matches_llama_cpps_own_quantizer(quant_run, quant, tmp_path):
    run, f16, windows = quant_run
    ours = export(run, "gguf", tmp_path / "ours", quant=quant) / "model.gguf"
    theirs = tmp_path / "theirs.gguf"
    llama_quantize(f16, theirs, quant)
    assert tensor_types(ours) == tensor_types(theirs)  # the same mix, tensor by tensor
    size_ratio = ours.stat().st_size / theirs.stat().st_size
    assert abs(size_ratio - 1) < 0.05, size_ratio
    ppl_ours, ppl_theirs = (llama_cpp_perplexity(p, windows) for p in (ours, theirs))
    assert abs(ppl_ours / ppl_theirs - 1) < 0.02, (ppl_ours, ppl_theirs)
    llm = llama_cpp.Llama(str(ours), n_ctx=64, n_threads=1, verbose=False)
    text = llm("def add(a", max_tokens=8, temperature=0.0)["choices"][0]["text"]
    assert len(llm.tokenize(text.encode(), add_bos=False)) >= 1  # it loads and generates


# Tiny MoE models wide enough for K-quant blocks (256 columns): Mixtral with 8 experts
# (llama.cpp's 8-expert rule for attention); Qwen2-MoE with its shared expert, and experts 288
# wide, as Qwen1.5-MoE's 1408 are no multiple of 256: their ffn_down_exps falls back.
MOE_WIDE = {"hidden_size": 256, "num_attention_heads": 4, "head_dim": 64, "intermediate_size": 256}
MOE_QUANT = {
    "mixtral": {"num_local_experts": 8},
    "qwen2_moe": {
        "num_hidden_layers": 2,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 288,
        "shared_expert_intermediate_size": 256,
    },
}
MORE_BITS_DOWN = {"mixtral": "Q6_K", "qwen2_moe": "Q8_0"}  # Q6_K, or its fallback


@pytest.mark.parametrize("family", list(MOE_QUANT))
def test_moe_q4_k_m_matches_llama_cpps_own_quantizer(tmp_path, family):
    """Our q4_k_m of an MoE model against llama-quantize's on our f32 file: the same type
    for every tensor (experts, router, shared expert), the perplexity within 2%."""
    _, tok = make_model(
        tmp_path / "model", family, initializer_range=0.02, **MOE_WIDE, **MOE_QUANT[family]
    )
    f32 = export(tmp_path / "model", "gguf", tmp_path / "f32", quant="f32") / "model.gguf"
    ours = export(tmp_path / "model", "gguf", tmp_path / "ours", quant="q4_k_m") / "model.gguf"
    theirs = tmp_path / "theirs.gguf"
    llama_quantize(f32, theirs, "q4_k_m")
    types = tensor_types(ours)
    assert types == tensor_types(theirs)
    assert types["blk.1.ffn_down_exps.weight"] == MORE_BITS_DOWN[family]  # a more-bits layer
    ids = tok(TEXT)["input_ids"]
    windows = [ids[i : i + 64] for i in range(0, len(ids) - 64, 64)][:4]
    ppl_ours, ppl_theirs = (llama_cpp_perplexity(p, windows) for p in (ours, theirs))
    assert abs(ppl_ours / ppl_theirs - 1) < 0.02, (ppl_ours, ppl_theirs)


def test_gpt_oss_mxfp4_experts_are_llama_cpps_bytes(tmp_path):
    """--quant mxfp4: gpt-oss's experts in MXFP4 and the other matrices in Q8_0, as
    llama-quantize's MXFP4_MOE makes them from our f32 file, byte for byte; llama.cpp scores
    the file as TrainDeck scores the model holding the file's dequantized weights."""
    import gguf

    rope = {**GPT_OSS_CONFIG["rope_parameters"], "truncate": True}
    options = {"hidden_size": 64, "intermediate_size": 64, "initializer_range": 0.02}
    _, tok = make_model(
        tmp_path / "model", "gpt_oss", swiglu_limit=7.0, rope_parameters=rope, **options
    )
    f32 = export(tmp_path / "model", "gguf", tmp_path / "f32", quant="f32") / "model.gguf"
    ours = export(tmp_path / "model", "gguf", tmp_path / "ours", quant="mxfp4") / "model.gguf"
    theirs = tmp_path / "theirs.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_MXFP4_MOE, 1
    assert llama_cpp.llama_model_quantize(str(f32).encode(), str(theirs).encode(), params) == 0
    mine = {t.name: t for t in gguf.GGUFReader(str(ours)).tensors}
    for t in gguf.GGUFReader(str(theirs)).tensors:
        assert mine[t.name].tensor_type == t.tensor_type, t.name
        assert np.array_equal(np.asarray(mine[t.name].data), np.asarray(t.data)), t.name
    assert mine["blk.0.ffn_down_exps.weight"].tensor_type.name == "MXFP4"
    ids = tok("def add(a, b): hello world 12 The quick brown fox")["input_ids"]
    loaded = load(tmp_path / "model")
    with torch.no_grad():
        dequantized = dequantized_model(loaded, ours).logits(torch.tensor([ids]))[0].numpy()
        plain = loaded.model.logits(torch.tensor([ids]))[0].numpy()
    llm = llama_cpp.Llama(
        str(ours), n_ctx=64, logits_all=True, n_threads=1, type_k=0, type_v=0, verbose=False
    )
    llm.eval(ids)
    scored = log_likelihoods(np.array(llm.scores[: len(ids)]), ids)
    # llama.cpp's Q8_0 products round the activations too: close, and far closer than to
    # the unquantized model's
    to_file = np.abs(scored - log_likelihoods(dequantized, ids)).max()
    assert to_file < 1e-2 and to_file < 0.2 * np.abs(scored - log_likelihoods(plain, ids)).max()
    # A released-style MXFP4 checkpoint's experts, dequantized at load, are e2m1 values on
    # power-of-two scales: written back in MXFP4 they come back exactly
    from test_gpt_oss import mxfp4_folder

    mxfp4_folder(tmp_path / "model", tmp_path / "packed")
    again = export(tmp_path / "packed", "gguf", tmp_path / "again", quant="mxfp4") / "model.gguf"
    packed = load(tmp_path / "packed")
    back = dequantized_model(packed, again).state_dict()
    experts = [k for k in back if k.endswith((".gate_up", ".down"))]
    assert len(experts) == 2 * packed.model.config.n_layers
    for name in experts:
        assert torch.equal(back[name], packed.model.state_dict()[name]), name


# -- a LoRA adapter alone, loaded by llama.cpp on its base -------------------------------


# qwen3_5: its DeltaNet's projections, v heads in llama.cpp's tiled order
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "gemma3", "phi3", "qwen3_5"])
def test_gguf_lora_adapter_on_its_base_equals_the_merged_model(tmp_path, family):
    """llama.cpp with the base GGUF and the adapter GGUF (--lora) computes the logits of the
    merged model: the adapter's names, shapes, row order and alpha are llama.cpp's."""
    make_model(tmp_path / "base", family)
    data = tmp_path / "text.txt"
    data.write_text(TEXT * 5, encoding="utf-8")
    cfg = tiny_config(
        init_from=str(tmp_path / "base"),
        tokenizer="model",
        data=str(data),
        lora_rank=4,
        lora_alpha=8.0,
        lr=3e-2,
        max_steps=15,
        seq_len=32,
        dropout=0.0,
        sample_tokens=0,
        hidden_dim=32,
        n_layers=2,
        n_heads=4,
        bias=False,
    )
    Trainer(cfg, tmp_path / "run").run()
    export(tmp_path / "base", "gguf", tmp_path / "base-gguf", quant="f32")
    export(tmp_path / "run", "gguf-lora", tmp_path / "adapter")
    loaded = load(tmp_path / "run")
    ids = prompt_ids(loaded.tokenizer, "def add(a, b): hello world")
    with torch.no_grad():
        ours = loaded.model.logits(torch.tensor([ids]))[0].numpy()  # adapters applied
        base = load(tmp_path / "base").model.logits(torch.tensor([ids]))[0].numpy()
    assert np.abs(ours - base).max() > 0.05  # the adapter changed something
    llm = llama_cpp.Llama(
        str(tmp_path / "base-gguf" / "model.gguf"),
        lora_path=str(tmp_path / "adapter" / "adapter.gguf"),
        n_ctx=32,
        logits_all=True,
        n_threads=1,
        verbose=False,
    )
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)])
    assert np.abs(theirs - ours).max() < 0.05 * max(1.0, np.abs(ours).std())
    assert np.abs(theirs - ours).max() < 0.1 * np.abs(ours - base).max()  # not the base's
    # The merged export (adapters folded in tensor by tensor while writing) agrees as well.
    merged = export(tmp_path / "run", "gguf", tmp_path / "merged", quant="f32") / "model.gguf"
    llm = llama_cpp.Llama(str(merged), n_ctx=32, logits_all=True, n_threads=1, verbose=False)
    llm.eval(ids)
    assert np.abs(np.array(llm.scores[: len(ids)]) - ours).max() < 0.1 * np.abs(ours - base).max()
