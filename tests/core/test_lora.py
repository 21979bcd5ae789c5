"""LoRA on tiny random Llama- and GPT-2-shaped models built with transformers: the base is
untouched, adapters train, resume is exact, PEFT loads the adapter with equal logits."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import StopAfter

pytest.importorskip("transformers")

from hf_models import QWEN_1_5B, TEXT, make_model  # noqa: E402

from core.cli.train import main as train_main  # noqa: E402
from core.config.spec import TrainConfig, validate  # noqa: E402
from core.models import lora  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.weights.loader import load, open_pretrained  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-models")
    return {f: (root / f, *make_model(root / f, f)) for f in ("llama", "gpt2")}


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lora-data") / "notes.txt"
    path.write_text(TEXT * 6, encoding="utf-8")
    return path


def lora_config(folder, data, **kw) -> TrainConfig:
    values = dict(
        init_from=str(folder),
        tokenizer="model",
        data=str(data),
        device="cpu",
        precision="fp32",
        max_steps=12,
        eval_every=6,
        ckpt_every=6,
        batch_size=4,
        grad_accum=1,
        seq_len=32,
        lr=1e-2,
        warmup_steps=2,
        eval_batches=2,
        sample_tokens=4,
        lora_rank=4,
        lora_dropout=0.1,
        hidden_dim=32,
        n_layers=2,
        n_heads=4,
        bias=False,
    )
    values.update(kw)
    return validate(TrainConfig(**values))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_step_zero_is_the_base_and_only_adapters_train(models, data_file, tmp_path, family):
    folder, hf_model, tok = models[family]
    pre = open_pretrained(folder)
    model = pre.load_model()
    ids = torch.tensor([tok("def add(a, b): hello")["input_ids"]])
    before = model.logits(ids)
    lora.apply_lora(model, 4, 8.0, 0.0, "all")
    after = model.logits(ids)
    assert torch.equal(before, after)  # B starts at zero
    assert lora.trainable_params(model) == lora.adapter_params(model) > 0

    bias = family == "gpt2"
    cfg = lora_config(folder, data_file, bias=bias)
    Trainer(cfg, tmp_path / "run").run()
    losses = [
        r["val_loss"]
        for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
        if "val_loss" in r
    ]
    assert losses[-1] < losses[0]  # step 0 is the base model's loss
    tuned = load(tmp_path / "run", "latest").model
    base = pre.load_model().state_dict()
    for name, value in tuned.state_dict().items():
        if lora.is_adapter(name):
            continue
        assert torch.equal(value, base[name]), name  # the base is bit-identical
    state = torch.load(tmp_path / "run" / "checkpoints" / "latest.pt", weights_only=True)
    assert state["adapters_only"] and all(lora.is_adapter(k) for k in state["model"])


def test_checkpoint_holds_adapters_not_the_base(models, data_file, tmp_path):
    folder = models["llama"][0]
    Trainer(lora_config(folder, data_file), tmp_path / "lora").run()
    Trainer(lora_config(folder, data_file, lora_rank=0), tmp_path / "full").run()
    size = {
        k: (tmp_path / k / "checkpoints" / "latest.pt").stat().st_size for k in ("lora", "full")
    }
    state = torch.load(tmp_path / "lora" / "checkpoints" / "latest.pt", weights_only=True)
    adapter_bytes = sum(t.numel() * 4 for t in state["model"].values())
    moments = sum(
        t.numel() * 4 for s in state["optimizer"]["state"].values() for t in s.values() if t.dim()
    )
    assert moments == 2 * adapter_bytes  # AdamW state of the adapters, nothing else
    base_bytes = open_pretrained(folder).n_params() * 4
    # the full fine-tune's checkpoint carries weights and AdamW state of the whole model
    assert size["full"] - size["lora"] > 2.5 * base_bytes
    assert size["lora"] < size["full"] - 3 * base_bytes + 3 * adapter_bytes + 20_000


@pytest.mark.parametrize("rank", [4, 0], ids=["lora", "full"])
def test_resume_after_a_stop_is_bitwise_the_uninterrupted_run(models, data_file, tmp_path, rank):
    folder = models["llama"][0]
    cfg = lora_config(folder, data_file, max_steps=10, eval_every=5, ckpt_every=5, lora_rank=rank)
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "split").run(control=StopAfter(4))
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    Trainer(cfg, tmp_path / "split", resume_from=latest).run()
    a = torch.load(tmp_path / "straight" / "checkpoints" / "latest.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "checkpoints" / "latest.pt", weights_only=True)
    assert a["step"] == b["step"] == 10
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_peft_and_merged_exports_equal_traindecks_logits(models, data_file, tmp_path, family):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder, _, tok = models[family]
    Trainer(lora_config(folder, data_file, bias=family == "gpt2"), tmp_path / "run").run()
    export(tmp_path / "run", "peft", tmp_path / "peft", which="latest")
    export(tmp_path / "run", "hf", tmp_path / "merged", which="latest")
    adapter = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "LORA" and adapter["r"] == 4 and adapter["lora_alpha"] == 8
    ours = load(tmp_path / "run", "latest").model
    ids = torch.tensor([tok("def add(a, b): return a + b")["input_ids"]])
    base = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = ours.logits(ids)
        assert (base(ids).logits - expected).abs().max() > 1e-3  # the adapters changed it
        peft_model = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
        assert (peft_model(ids).logits - expected).abs().max() < 1e-4
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
        assert (merged(ids).logits - expected).abs().max() < 1e-4


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--lora-alpha", "8"], "lora_alpha: set only with lora_rank > 0"),
        (["--lora-rank", "64"], "lora_rank: 64 is larger than the smallest adapted dimension"),
        (
            ["--lora-rank", "4", "--lora-targets", "heads"],
            "lora_targets: expected one of attn, mlp, all",
        ),
    ],
)
def test_bad_lora_settings_are_one_line_exit_2(models, data_file, tmp_path, capsys, extra, needle):
    out = tmp_path / "run"
    args = ["--init-from", str(models["llama"][0]), "--data", str(data_file), "--out", str(out)]
    assert train_main([*args, "--max-steps", "2", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


def test_resume_with_other_lora_settings_or_base_is_refused(models, data_file, tmp_path, capsys):
    base = tmp_path / "base"
    shutil.copytree(models["llama"][0], base)
    run = tmp_path / "run"
    Trainer(lora_config(base, data_file, max_steps=4, ckpt_every=2), run).run()
    capsys.readouterr()
    assert train_main(["--resume", str(run), "--lora-rank", "8", "--max-steps", "6"]) == 2
    assert "lora_rank 4 -> 8 (architecture)" in capsys.readouterr().err
    make_model(tmp_path / "other", "llama", seed=3)
    shutil.copy(tmp_path / "other" / "model.safetensors", base / "model.safetensors")
    assert train_main(["--resume", str(run), "--max-steps", "6"]) == 2
    assert "other weights" in capsys.readouterr().err


# -- memory: estimate and "Fit to my GPU" for a pretrained start ----------------------------


@pytest.fixture
def big_config(tmp_path):
    """A Qwen2.5-1.5B-shaped config.json: the estimate reads only the shape."""
    folder = tmp_path / "qwen-1.5b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN_1_5B))
    return validate(
        TrainConfig(
            init_from=str(folder),
            tokenizer="model",
            hidden_dim=1536,
            n_layers=28,
            n_heads=12,
            bias=False,
            seq_len=1024,
            batch_size=8,
            grad_accum=1,
        )
    )


def test_estimate_counts_the_frozen_base_and_the_adapters(big_config):
    import dataclasses

    from core.models.params import adapter_count
    from core.training.estimate import estimate, model_shape

    full = estimate(big_config, precision="bf16", on_gpu=True)
    assert 1.5e9 < full.n_params < 1.6e9  # Qwen2.5-1.5B: 1.54B with the tied head
    assert full.gradients == 4 * full.n_params and full.optimizer == 8 * full.n_params
    lora_cfg = dataclasses.replace(big_config, lora_rank=16)
    low = estimate(lora_cfg, precision="bf16", on_gpu=True)
    adapters = adapter_count(model_shape(lora_cfg), 16, "all")
    c = model_shape(lora_cfg)
    per_layer = 16 * (
        (c.hidden_dim + c.n_heads * c.head_dim + 2 * c.n_kv_heads * c.head_dim)
        + (c.n_heads * c.head_dim + c.hidden_dim)
        + (c.hidden_dim + 2 * c.ffn_dim)
        + (c.ffn_dim + c.hidden_dim)
    )
    assert adapters == c.n_layers * per_layer
    assert low.weights == 2 * low.n_params + 4 * adapters  # 16-bit base, fp32 adapters
    assert low.gradients == 4 * adapters and low.optimizer == 8 * adapters
    # about 16 bytes a parameter for a full fine-tune (weights, gradients, AdamW, casts)
    # against 2 for a 16-bit frozen base; the adapters keep their inputs beside the same
    # activations (an H100 measured both: docs/gpu.md)
    kept = low.activations - full.activations
    assert 0 < kept < 0.5 * full.activations
    assert full.device_total - low.device_total > 14 * full.n_params - 1.1 * kept


def test_fit_walks_full_then_8_bit_adamw_then_lora_then_a_4_bit_base(big_config):
    from core.training.estimate import GB, estimate
    from core.training.planner import fit_pretrained

    roomy, why = fit_pretrained(big_config, 80 * GB)
    assert roomy.lora_rank == 0 and roomy.optimizer == "adamw"
    assert why.startswith("full fine-tuning (AdamW) fits")
    eight, why = fit_pretrained(big_config, 24 * GB)
    assert eight.lora_rank == 0 and eight.optimizer == "adamw8bit"
    assert why.startswith("full fine-tuning (8-bit AdamW)")
    small, why = fit_pretrained(big_config, 12 * GB)
    assert small.lora_rank == 16 and small.base_bits != "4"
    assert small.batch_size * small.grad_accum == 8  # the effective batch is kept
    assert estimate(small).device_total <= 0.9 * 12 * GB
    assert why.startswith("LoRA rank 16 (16-bit base)")
    assert "full fine-tuning (8-bit AdamW)" in why and "do not fit" in why  # rungs above
    tiny, why = fit_pretrained(big_config, int(4.0 * GB))  # a 4 GB card, context included
    assert tiny.base_bits == "4" and tiny.grad_checkpointing and why.startswith("QLoRA")
    assert estimate(tiny).device_total <= 0.9 * 4.0 * GB
    nothing, why = fit_pretrained(big_config, 1 * GB)
    assert nothing is None and "none fits" in why and "QLoRA" in why


def test_a_4_bit_base_is_estimated_at_about_half_a_byte_a_weight(big_config):
    import dataclasses

    from core.models.params import adapted_weights
    from core.training.estimate import estimate, model_shape

    lora = dataclasses.replace(big_config, lora_rank=16)
    sixteen = estimate(lora, precision="bf16", on_gpu=True)
    four = estimate(dataclasses.replace(lora, base_bits="4"), precision="bf16", on_gpu=True)
    q = adapted_weights(model_shape(lora), "all")
    assert 0.8 * sixteen.n_params < q < sixteen.n_params  # the blocks' matrices
    saved = sixteen.weights - four.weights
    assert saved == pytest.approx(q * (2 - 0.5 - 1 / 64), rel=0.01)


def test_gradient_checkpointing_trains_the_same_adapters(models, data_file, tmp_path):
    folder = models["llama"][0]
    runs = {}
    for ckpt in (False, True):
        cfg = lora_config(
            folder,
            data_file,
            max_steps=3,
            eval_every=3,
            ckpt_every=3,
            lora_dropout=0.0,
            grad_checkpointing=ckpt,
        )
        Trainer(cfg, tmp_path / str(ckpt)).run()
        path = tmp_path / str(ckpt) / "checkpoints" / "latest.pt"
        runs[ckpt] = torch.load(path, weights_only=True)["model"]
    for name, value in runs[False].items():
        assert torch.allclose(value, runs[True][name], atol=1e-6), name
