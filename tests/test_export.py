"""Exports proven by the other tools: transformers' logits and greedy text, gguf's reader."""

import json

import numpy as np
import pytest
import torch
from helpers import tiny_config

from core.export import export, main
from core.generate import generate_ids, load
from core.generate import main as generate_main
from core.trainer import Trainer

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

TEXT = "def add(a, b):\n    return a + b  # sum of two numbers, ünïcode ok\n"


@pytest.fixture(scope="module", params=["bytes", "bpe", "bytes-nobias"])
def run(request, tmp_path_factory):
    """Byte-level and BPE runs, and one without biases (GPT-2 gets zero biases)."""
    root = tmp_path_factory.mktemp(f"export-{request.param}")
    tokenizer, _, nobias = request.param.partition("-")
    data = root / "code.txt"
    data.write_text(TEXT * 3000, encoding="utf-8")
    cfg = tiny_config(
        data=str(data), tokenizer=tokenizer, bias=not nobias, vocab_size=512, max_steps=150,
        lr=1e-2, dropout=0.0, eval_every=50, ckpt_every=50, seq_len=48,
    )  # fmt: skip
    Trainer(cfg, root / "run").run()
    return root / "run"


def test_hf_export_loads_in_transformers_with_equal_logits_and_greedy_text(run, tmp_path, capsys):
    out = export(run, "hf", tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= {
        p.name for p in out.iterdir()
    }
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ours = load(run)
    prompt = "def add(a, b):\n    ret"
    ids = ours.tokenizer.encode(prompt)
    assert tok(prompt)["input_ids"] == ids
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits
        mine, _ = ours.model(torch.tensor([ids]))
    assert torch.allclose(theirs, mine, atol=1e-4)
    n = ours.model.config.seq_len - len(ids)
    greedy = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    new = greedy[0, len(ids) :].tolist()
    assert new == list(generate_ids(ours.model, ids, n, temperature=0))
    assert len(set(new)) > 1  # a trained model, not a constant
    args = [str(run), "--prompt", prompt, "--temperature", "0", "--max-new-tokens", str(n)]
    assert generate_main(args) == 0
    assert capsys.readouterr().out.rstrip("\n") == tok.decode(greedy[0])
    card = (out / "README.md").read_text()
    assert "150 optimizer steps" in card and "Validation loss" in card


def test_gguf_export_reads_back_with_the_weights_and_tokenizer(run, tmp_path):
    out = export(run, "gguf", tmp_path / "gguf")
    reader = gguf.GGUFReader(str(out / "model.gguf"))
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    model = load(run).model
    w = {k: v.numpy() for k, v in model.state_dict().items()}
    assert np.array_equal(tensors["token_embd.weight"], w["tok_emb.weight"])
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
