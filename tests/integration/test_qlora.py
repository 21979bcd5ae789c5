"""A 4-bit base (QLoRA, bitsandbytes NF4 with double quantization) on tiny random models built
with transformers' own config classes, with dimensions bitsandbytes' blocks accept."""

from __future__ import annotations

import builtins
import dataclasses

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")

from helpers import StopAfter, tiny_config  # noqa: E402
from hf_models import TEXT, make_model  # noqa: E402

from core.cli.train import main as train_main  # noqa: E402
from core.models import quant  # noqa: E402
from core.models.lora import LoRALinear  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from core.training import inputs  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.weights.loader import load, open_pretrained  # noqa: E402

SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "initializer_range": 0.02,
}


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"qlora-{request.param}")
    make_model(root / "model", request.param, **SHAPE)
    (root / "text.txt").write_text(TEXT * 5, encoding="utf-8")
    cfg = tiny_config(
        init_from=str(root / "model"),
        tokenizer="model",
        lr=None,
        data=str(root / "text.txt"),
        lora_rank=8,
        base_bits="4",
        max_steps=16,
        eval_every=8,
        ckpt_every=8,
        hidden_dim=64,
        n_heads=4,
        bias=False,
        dropout=0.0,
        sample_tokens=0,
    )
    return root, cfg


def quantized_model(cfg):
    pre = open_pretrained(cfg.init_from)
    return inputs.build_model(cfg, pre, torch.device("cpu"), "fp32", lambda m: None), pre


def test_the_adapted_base_layers_are_stored_in_4_bits(setup):
    _, cfg = setup
    model, _ = quantized_model(cfg)
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert layers and all(m.weight is None for m in layers)
    for m in layers:
        n = m.in_features * m.out_features
        packed = m.base_quantized.weight.numel() * m.base_quantized.weight.element_size()
        assert packed == n // 2  # two NF4 values a byte
        assert n // 2 < quant.quantized_bytes(m.base_quantized) < n // 2 + n // 16 + 4096
    assert model.tok_emb.weight.dtype == torch.float32  # embeddings, norms, head: as they were


def test_step_zero_logits_are_the_dequantized_models(setup):
    _, cfg = setup
    model, pre = quantized_model(cfg)
    plain = pre.load_model(model.config)
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear):
            plain.get_submodule(name).weight.data = quant.dequantized_weight(m)
    idx = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        ours, theirs = model.logits(idx), plain.logits(idx)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_it_trains_resumes_bitwise_and_keeps_the_base(setup, tmp_path):
    _, cfg = setup
    trainer = Trainer(cfg, tmp_path / "straight")
    trainer.run()
    evals = read_metrics(tmp_path / "straight" / "metrics.jsonl")[1]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
    fresh, _ = quantized_model(cfg)
    for (name, m), (_, f) in zip(trainer.model.named_modules(), fresh.named_modules(), strict=True):
        if isinstance(m, LoRALinear):  # training never touched the 4-bit base
            assert torch.equal(m.base_quantized.weight.data, f.base_quantized.weight.data), name
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(5))
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    Trainer(cfg, tmp_path / "split", resume_from=latest).run()
    straight = read_metrics(tmp_path / "straight" / "metrics.jsonl")[0]
    split = read_metrics(tmp_path / "split" / "metrics.jsonl")[0]
    assert [r["loss"] for r in split] == [r["loss"] for r in straight]


def test_the_merged_export_uses_the_original_weights_and_loads_in_transformers(setup, tmp_path):
    from transformers import AutoModelForCausalLM

    root, cfg = setup
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.run()
    out = export(tmp_path / "run", "hf", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(out).float().eval()
    merged = load(tmp_path / "run").model  # the 16-bit base from the folder, adapters merged
    idx = torch.randint(0, merged.config.vocab_size, (1, 16))
    with torch.no_grad():
        theirs, ours, trained = hf(idx).logits, merged.logits(idx), trainer.model.eval().logits(idx)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    # What 4 bits cost: the training view against the merged full-precision export.
    error = (trained - ours).pow(2).mean().sqrt() / ours.pow(2).mean().sqrt()
    print(f"4-bit training view vs merged export: relative RMS {float(error):.4f}")
    assert 0 < error < 0.2, error


def test_bad_4_bit_requests_are_one_line_exit_2(setup, tmp_path, capsys, monkeypatch):
    root, cfg = setup
    base = [
        "--init-from",
        cfg.init_from,
        "--data",
        cfg.data,
        "--max-steps",
        "2",
        "--data-cache",
        str(tmp_path / "c"),
        "--out",
        str(tmp_path / "r"),
    ]
    assert train_main([*base, "--base-bits", "4"]) == 2  # no --lora-rank: full fine-tuning
    assert "base_bits: a 4-bit base trains only with LoRA" in capsys.readouterr().err
    real_import = builtins.__import__

    def no_bnb(name, *args, **kwargs):
        if name.startswith("bitsandbytes"):
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bnb)
    assert train_main([*base, "--base-bits", "4", "--lora-rank", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "needs the bitsandbytes package" in err[-1] and "pip install bitsandbytes" in err[-1]


def test_a_resume_with_other_bits_is_refused_naming_both(setup, tmp_path, capsys):
    _, cfg = setup
    Trainer(cfg, tmp_path / "run").run(None, StopAfter(3))
    latest = tmp_path / "run" / "checkpoints" / "latest.pt"
    other = dataclasses.replace(cfg, base_bits="16")
    with pytest.raises(Exception, match=r"base_bits '4' -> '16'"):
        Trainer(other, tmp_path / "run", resume_from=latest).run()


def test_gradients_through_a_4_bit_layer_are_the_dequantized_weights(setup):
    """bitsandbytes' one-token kernel has no autograd entry (it warns); its input gradients,
    which reach the adapters of the layers below, are right all the same."""
    _, cfg = setup
    model, _ = quantized_model(cfg)
    m = next(m for m in model.modules() if isinstance(m, LoRALinear))
    w = quant.dequantized_weight(m)
    for shape in [(2, 8, m.in_features), (1, 1, m.in_features)]:
        x = torch.randn(*shape, requires_grad=True)
        g = torch.randn(*shape[:-1], m.out_features)
        (m.base_quantized(x) * g).sum().backward()
        x2 = x.detach().clone().requires_grad_(True)
        ((x2 @ w.t()) * g).sum().backward()
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-5)


def test_an_8_bit_base_stores_a_byte_a_weight_and_trains(setup, tmp_path):
    _, cfg = setup
    cfg = dataclasses.replace(cfg, base_bits="8")
    model, pre = quantized_model(cfg)
    for m in model.modules():
        if isinstance(m, LoRALinear):
            assert m.base_quantized.weight.dtype == torch.int8
            assert m.base_quantized.weight.numel() == m.in_features * m.out_features
    Trainer(cfg, tmp_path / "run").run()
    evals = read_metrics(tmp_path / "run" / "metrics.jsonl")[1]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
