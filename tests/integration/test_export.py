"""Exports proven by the other tools: transformers' logits and greedy text, gguf's reader.
New models of arch gpt2 export as GPT-2, of arch llama as Llama (Qwen3 with q/k norms)."""

import json

import numpy as np
import pytest
import torch
from helpers import tiny_config

from core.cli.export import main
from core.cli.generate import main as generate_main
from core.models.model import GPTConfig
from core.training.trainer import Trainer
from core.use.export import export
from core.use.generate import generate_ids, load
from core.weights import families

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

TEXT = "def add(a, b):\n    return a + b  # sum of two numbers, ünïcode ok\n"


@pytest.fixture(scope="module", params=["bytes", "bpe", "bytes-nobias"])
def run(request, tmp_path_factory):
    """GPT-2 runs: byte-level and BPE, and one without biases (GPT-2 gets zero biases)."""
    root = tmp_path_factory.mktemp(f"export-{request.param}")
    tokenizer, _, nobias = request.param.partition("-")
    data = root / "code.txt"
    data.write_text(TEXT * 3000, encoding="utf-8")
    cfg = tiny_config(
        data=str(data),
        arch="gpt2",
        tokenizer=tokenizer,
        bias=not nobias,
        vocab_size=512,
        max_steps=150,
        lr=1e-2,
        dropout=0.0,
        eval_every=50,
        ckpt_every=50,
        seq_len=48,
    )
    Trainer(cfg, root / "run").run()
    return root / "run"


PROMPT = "def add(a, b):\n    ret"


def assert_transformers_agrees(model, tok, ours):
    """transformers' tokenizer ids, logits and greedy text over the rest of the context equal
    TrainDeck's. Returns (prompt ids, new tokens, transformers' greedy output)."""
    ids = ours.tokenizer.encode(PROMPT)
    assert tok(PROMPT)["input_ids"] == ids
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits
        mine = ours.model.logits(torch.tensor([ids]))
    assert torch.allclose(theirs, mine, atol=1e-4, rtol=0)
    n = ours.model.config.seq_len - len(ids)
    greedy = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    new = greedy[0, len(ids) :].tolist()
    assert new == list(generate_ids(ours.model, ids, n, temperature=0))
    assert len(set(new)) > 1  # a trained model, not a constant
    return ids, n, greedy


def gguf_and_weights(run, tmp_path):
    """The GGUF export read back: (reader, its tensors, TrainDeck's model, its weights); the
    token embedding, which every architecture has, checked equal."""
    out = export(run, "gguf", tmp_path / "gguf", quant="f32")
    reader = gguf.GGUFReader(str(out / "model.gguf"))
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    model = load(run).model
    w = {k: v.numpy() for k, v in model.state_dict().items()}
    assert np.array_equal(tensors["token_embd.weight"], w["tok_emb.weight"])
    return reader, tensors, model, w


def test_hf_export_loads_in_transformers_with_equal_logits_and_greedy_text(run, tmp_path, capsys):
    out = export(run, "hf", tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= {
        p.name for p in out.iterdir()
    }
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids, n, greedy = assert_transformers_agrees(model, tok, load(run))
    args = [str(run), "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", str(n)]
    assert generate_main(args) == 0
    assert capsys.readouterr().out.rstrip("\n") == tok.decode(greedy[0])
    card = (out / "README.md").read_text()
    assert "150 optimizer steps" in card and "Validation loss" in card
    assert "GPT-2 (GPT2LMHeadModel)" in card


def test_gguf_export_reads_back_with_the_weights_and_tokenizer(run, tmp_path):
    reader, tensors, model, w = gguf_and_weights(run, tmp_path)
    assert np.array_equal(tensors["blk.1.attn_qkv.weight"], w["blocks.1.attn.qkv.weight"])
    bias = w.get("blocks.0.mlp.proj.bias", np.zeros(model.config.hidden_dim, np.float32))
    assert np.array_equal(tensors["blk.0.ffn_down.bias"], bias)  # zeros for a bias-free model
    assert len(tensors) == 5 + 12 * model.config.n_layers
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "gpt2"
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == model.config.vocab_size


def test_safetensors_export_holds_the_weights_and_config(run, tmp_path):
    from safetensors.torch import load_file

    out = export(run, "safetensors", tmp_path / "st")
    weights = load_file(out / "model.safetensors")
    model = load(run).model
    assert torch.equal(weights["tok_emb.weight"], model.tok_emb.weight)
    config = json.loads((out / "config.json").read_text())
    assert config["train_config"]["hidden_dim"] == model.config.hidden_dim


def test_bad_export_input_is_one_line_exit_2_and_writes_nothing(run, tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    cases = [
        ([str(run), "--format", "onnx", "--out", str(tmp_path / "a")], "invalid choice"),
        ([str(run), "--format", "hf", "--out", str(taken)], "not an empty folder"),
        ([str(tmp_path / "none"), "--format", "hf", "--out", str(tmp_path / "b")], "neither"),
    ]
    for args, needle in cases:
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


# -- new models of arch llama: Llama, or Qwen3 with q/k norms --------------------------------

LLAMA_RUNS = {  # family: (qk_norm, tokenizer)
    "llama": (False, "bytes"),
    "qwen3": (True, "bpe"),
}


def test_a_new_models_family_follows_its_arch():
    shapes = {
        "gpt2": dict(arch="gpt2"),
        "llama": dict(arch="llama", n_heads=4, n_kv_heads=2),
        "qwen3": dict(arch="llama", qk_norm=True),
    }
    for family, settings in shapes.items():
        c = GPTConfig.from_train(tiny_config(**settings), training=False)
        assert families.new_model_family(c) == family
        config = families.new_model_hf_config(c)
        assert config["model_type"] == family
        assert config["architectures"] == [families.HF_ARCH[family]]


@pytest.fixture(scope="module", params=list(LLAMA_RUNS))
def llama_run(request, tmp_path_factory):
    """A new llama-arch model with grouped-query attention, trained a little (Muon)."""
    root = tmp_path_factory.mktemp(f"export-{request.param}")
    qk_norm, tokenizer = LLAMA_RUNS[request.param]
    data = root / "code.txt"
    data.write_text(TEXT * 3000, encoding="utf-8")
    cfg = tiny_config(
        data=str(data),
        arch="llama",
        n_heads=4,
        n_kv_heads=2,
        qk_norm=qk_norm,
        tokenizer=tokenizer,
        vocab_size=512,
        max_steps=60,
        dropout=0.0,
        eval_every=30,
        ckpt_every=30,
        sample_tokens=0,
    )
    Trainer(cfg, root / "run").run()
    return request.param, root / "run"


def test_llama_arch_exports_as_llama_or_qwen3_in_transformers(llama_run, tmp_path):
    family, run = llama_run
    ours = load(run)
    c = ours.model.config
    assert ours.family == family
    out = export(run, "hf", tmp_path / "hf")
    config = transformers.AutoConfig.from_pretrained(out)
    expected = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[family]
    assert type(config) is expected
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (
        c.hidden_dim,
        c.ffn_dim,
        c.n_layers,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 8)
    assert config.rms_norm_eps == 1e-6 and config.max_position_embeddings == c.seq_len
    assert config.tie_word_embeddings and config.vocab_size == c.vocab_size
    assert not config.attention_bias and config.bos_token_id is None
    assert config.rope_parameters["rope_theta"] == 10000.0
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert (
        type(model).__name__ == {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[family]
    )
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert_transformers_agrees(model, tok, ours)
    card = (out / "README.md").read_text()
    name = {"llama": "Llama (LlamaForCausalLM)", "qwen3": "Qwen3 (Qwen3ForCausalLM)"}[family]
    assert f"A {name} language model trained from scratch" in card and "Muon" in card


def test_llama_arch_gguf_export_reads_back_as_llama_or_qwen3(llama_run, tmp_path):
    family, run = llama_run
    reader, tensors, model, w = gguf_and_weights(run, tmp_path)
    assert np.array_equal(tensors["blk.1.ffn_down.weight"], w["blocks.1.mlp.proj.weight"])
    assert "output.weight" not in tensors  # tied to the embeddings
    per_layer = 9 + 2 * (family == "qwen3")  # norms, q k v o, gate up down (+ q/k norms)
    assert len(tensors) == 2 + per_layer * model.config.n_layers
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == family
    kv = reader.fields[f"{family}.attention.head_count_kv"]
    assert int(kv.parts[kv.data[0]][0]) == 2
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == model.config.vocab_size


def test_llama_arch_safetensors_export_holds_the_weights(llama_run, tmp_path):
    from safetensors.torch import load_file

    _, run = llama_run
    out = export(run, "safetensors", tmp_path / "st")
    weights = load_file(out / "model.safetensors")
    model = load(run).model
    assert set(weights) == set(model.state_dict()) - {"head.weight"}
    assert torch.equal(weights["blocks.0.attn.qkv.weight"], model.blocks[0].attn.qkv.weight)
    config = json.loads((out / "config.json").read_text())
    assert config["train_config"]["arch"] == "llama"


def test_llama_arch_lora_peft_export_names_llama_modules(tmp_path):
    data = tmp_path / "code.txt"
    data.write_text(TEXT * 300, encoding="utf-8")
    cfg = tiny_config(
        data=str(data),
        arch="llama",
        n_heads=4,
        n_kv_heads=2,
        lora_rank=4,
        max_steps=3,
        dropout=0.0,
        sample_tokens=0,
    )
    Trainer(cfg, tmp_path / "run").run()
    out = export(tmp_path / "run", "peft", tmp_path / "peft")
    config = json.loads((out / "adapter_config.json").read_text())
    assert "model.layers.1.self_attn.k_proj" in config["target_modules"]
    assert config["fan_in_fan_out"] is False
    from safetensors.torch import load_file

    weights = load_file(out / "adapter_model.safetensors")
    k_b = weights["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"]
    assert k_b.shape == (2 * 8, 4)  # the k rows of the fused q/k/v: 2 kv heads of 8
