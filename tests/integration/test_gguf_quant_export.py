"""Quantized GGUF exports read back through the gguf package: every tensor has the type the
mix chose, the file is the size its blocks make, the dequantized model is close to the
trained one; and bad requests stop with one line before anything is written."""

from __future__ import annotations

import pytest
from helpers import tiny_config

gguf = pytest.importorskip("gguf")

from core.cli.export import main as export_main  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use import gguf_quants as gq  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.gguf_quality import dequantized_model, perplexity, validation_windows  # noqa: E402
from core.weights.loader import load  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A llama-arch run 256 wide (K-quant blocks fit its rows), GQA, tied embeddings."""
    root = tmp_path_factory.mktemp("quant")
    cfg = tiny_config(
        hidden_dim=256,
        n_heads=4,
        n_kv_heads=2,
        n_layers=2,
        seq_len=32,
        max_steps=30,
        dropout=0.0,
        sample_tokens=0,
    )
    Trainer(cfg, root / "run").run()
    return root / "run"


@pytest.mark.parametrize("quant", [q for q in gq.QUANTS if q not in gq.EXPERT_TYPE])
def test_each_quant_type_reads_back_with_the_types_chosen(run, tmp_path, quant):
    logs = []
    out = export(run, "gguf", tmp_path / quant, quant=quant, log=logs.append)
    reader = gguf.GGUFReader(str(out / "model.gguf"))
    layers = load(run).model.config.n_layers
    names = {t.name for t in reader.tensors}
    tensor_bytes = 0
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        want, _ = gq.tensor_type(t.name, shape, quant, layers, tied="output.weight" not in names)
        assert t.tensor_type == want, t.name
        assert t.n_bytes == gq.expected_bytes(shape, want)
        tensor_bytes += t.n_bytes
    size = (out / "model.gguf").stat().st_size
    assert tensor_bytes < size < tensor_bytes + 64 * 1024  # blocks, plus header and padding
    assert any(line.startswith(f"gguf {quant}:") and "perplexity" in line for line in logs)


def test_the_dequantized_model_stays_close_and_f32_round_trips_exactly(run, tmp_path):
    loaded = load(run)
    windows = validation_windows(loaded)
    plain = perplexity(loaded.model, windows)
    f32 = export(run, "gguf", tmp_path / "f32", quant="f32") / "model.gguf"
    assert perplexity(dequantized_model(loaded, f32), windows) == pytest.approx(plain, rel=1e-6)
    q4 = export(run, "gguf", tmp_path / "q4", quant="q4_k_m") / "model.gguf"
    assert abs(perplexity(dequantized_model(loaded, q4), windows) / plain - 1) < 0.05
    state = dequantized_model(loaded, q4).state_dict()
    original = loaded.model.state_dict()["blocks.0.attn.qkv.weight"]
    error = (state["blocks.0.attn.qkv.weight"] - original).float()
    assert 0 < float(error.pow(2).mean().sqrt() / original.pow(2).mean().sqrt()) < 0.1


@pytest.mark.parametrize(
    "args, words",
    [
        (["--format", "gguf", "--quant", "q3_k"], "quant: expected one of"),
        (["--format", "gguf", "--quant", "mxfp4"], "quant: mxfp4 is for mixture-of-experts"),
        (["--format", "hf", "--quant", "q8_0"], "quant: only gguf and ollama"),
        (["--format", "gguf", "--ollama-create", "mine"], "--ollama-create: needs --format ollama"),
        (["--format", "hf", "--system", "Be brief."], "--system: only the ollama format"),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(run, tmp_path, capsys, args, words):
    out = tmp_path / "out"
    assert export_main([str(run), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_ollama_create_without_ollama_on_path(run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ollama here
    args = [str(run), "--format", "ollama", "--out", str(tmp_path / "o"), "--ollama-create", "m"]
    assert export_main(args) == 2
    assert "ollama is not on PATH" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_target_folder_that_is_not_empty_is_refused_untouched(run, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert export_main([str(run), "--format", "gguf", "--out", str(out)]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_f16_is_the_default_quant(run, tmp_path):
    out = export(run, "gguf", tmp_path / "d") / "model.gguf"
    types = {t.tensor_type for t in gguf.GGUFReader(str(out)).tensors if len(t.shape) == 2}
    assert types == {gguf.GGMLQuantizationType.F16}


def test_ollama_folder_holds_the_gguf_and_a_modelfile_that_stops(tmp_path, capsys):
    from hf_models import make_model

    make_model(tmp_path / "qwen", "qwen2")
    out = tmp_path / "ollama"
    args = [
        str(tmp_path / "qwen"),
        "--format",
        "ollama",
        "--quant",
        "q8_0",
        "--out",
        str(out),
        "--system",
        "Be brief.",
    ]
    assert export_main(args) == 0
    assert f"ollama create NAME -f {out / 'Modelfile'}" in capsys.readouterr().out
    text = (out / "Modelfile").read_text()
    assert text.startswith("FROM ./model.gguf\n") and "<|im_start|>" in text
    assert 'PARAMETER stop "<|im_end|>"' in text and 'SYSTEM """Be brief."""' in text
    reader = gguf.GGUFReader(str(out / "model.gguf"))
    template = reader.fields["tokenizer.chat_template"]
    assert (
        bytes(template.parts[template.data[0]]).decode()
        == load(tmp_path / "qwen").tokenizer.chat_template
    )


def test_a_template_ollama_cannot_be_given_is_refused_before_writing(tmp_path, capsys):
    from hf_models import make_model

    make_model(tmp_path / "odd", "llama")  # a made-up <|start|>...<|eot|> template
    capsys.readouterr()  # transformers' own output while saving the model
    out = tmp_path / "ollama"
    assert export_main([str(tmp_path / "odd"), "--format", "ollama", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "chat template is none TrainDeck can write for Ollama" in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_a_sentencepiece_tokenizer_goes_into_the_gguf_as_llama_cpps_llama_vocab(tmp_path):
    """Llama 2 / Mistral 7B v0.x tokenizers: pieces, scores in merge order, byte tokens typed
    BYTE, <unk>, the prepended space (llama.cpp itself is checked in test_llamacpp)."""
    from hf_models import make_model

    make_model(tmp_path / "llama2", "llama2")
    out = export(tmp_path / "llama2", "gguf", tmp_path / "gguf", quant="q8_0")
    fields = gguf.GGUFReader(str(out / "model.gguf")).fields

    def value(key):
        f = fields[key]
        return [f.contents(i) for i in range(len(f.data))] if len(f.data) > 1 else f.contents()

    assert value("tokenizer.ggml.model") == "llama" and value("tokenizer.ggml.add_space_prefix")
    tokens, scores = value("tokenizer.ggml.tokens"), value("tokenizer.ggml.scores")
    types = value("tokenizer.ggml.token_type")
    tok = load(tmp_path / "llama2").tokenizer
    assert tokens[tok.hf.token_to_id("<0x0A>")] == "<0x0A>"
    assert types[tok.hf.token_to_id("<0x0A>")] == gguf.TokenType.BYTE
    assert types[tok.hf.token_to_id("<unk>")] == gguf.TokenType.UNKNOWN
    assert value("tokenizer.ggml.unknown_token_id") == tok.hf.token_to_id("<unk>")
    merged = [i for i, s in enumerate(scores) if s < 0]
    assert merged and all(scores[a] > scores[b] for a, b in zip(merged, merged[1:], strict=False))
