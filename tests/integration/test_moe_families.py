"""The mixture-of-experts families (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE) against transformers' own
models: logits and greedy text, both weight layouts (released per-expert files and
transformers 5.x's fused tensors), the load-balancing loss of output_router_logits=True, full
fine-tuning and LoRA that resume bit for bit with the routing statistics in metrics.jsonl,
and the hf export that transformers loads with equal logits."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")

from helpers import StopAfter, tiny_config  # noqa: E402
from hf_models import MOE_FAMILIES, TEXT, make_model  # noqa: E402

from core.errors import UserError  # noqa: E402
from core.models import lora  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.common import ExportError  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.generate import generate_ids  # noqa: E402
from core.weights import families  # noqa: E402
from core.weights.loader import info_line, load, open_pretrained  # noqa: E402

PROMPT = "def add(a, b): hello world 12 The quick brown fox jumps over the lazy dog."

# Past hf_models' tiny models: other expert counts and top-k, norm_topk_prob the other way,
# every other layer sparse (decoder_sparse_step), no clip_qkv.
VARIANTS = {
    "qwen3_moe": ("qwen3_moe", {}),
    "qwen3_moe-step2-top1": (
        "qwen3_moe",
        {
            "norm_topk_prob": False,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [],
            "num_experts": 6,
            "num_experts_per_tok": 1,
        },
    ),
    "qwen2_moe": ("qwen2_moe", {}),
    "qwen2_moe-every-layer-norm-topk": (
        "qwen2_moe",
        {"decoder_sparse_step": 1, "norm_topk_prob": True, "mlp_only_layers": [2]},
    ),
    "mixtral": ("mixtral", {}),
    "mixtral-3-of-5": ("mixtral", {"num_local_experts": 5, "num_experts_per_tok": 3}),
    "olmoe": ("olmoe", {}),
    "olmoe-norm-topk": ("olmoe", {"norm_topk_prob": True, "clip_qkv": None}),
    "qwen3_5_moe": ("qwen3_5_moe", {}),
}


def assert_logits_equal(model, hf_model, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        want = hf_model(x).logits
        got = model.logits(x)
    assert (want - got).abs().max().item() < 1e-5


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_and_greedy_text_equal_transformers(tmp_path, variant):
    family, extra = VARIANTS[variant]
    hf_model, tok = make_model(tmp_path, family, **extra)
    loaded = load(tmp_path)
    assert loaded.family == family and loaded.model.moe_layers
    ids = tok(PROMPT)["input_ids"]
    assert_logits_equal(loaded.model, hf_model, ids)
    hf_model.generation_config.eos_token_id = None
    want = hf_model.generate(torch.tensor([ids[:10]]), do_sample=False, max_new_tokens=6)
    want = want[0, 10:].tolist()
    assert list(generate_ids(loaded.model, ids[:10], 6, 0, use_cache=True)) == want


def test_the_tiny_models_mix_dense_and_sparse_layers():
    from hf_models import MOE_CONFIGS, make_config

    qwen = families.model_config(make_config("qwen3_moe", 100).to_dict())[1]
    assert qwen.moe["sparse_layers"] == [0, 2] and qwen.moe["norm_topk"]
    olmoe = families.model_config(make_config("olmoe", 100).to_dict())[1]
    assert olmoe.qkv_clip == MOE_CONFIGS["olmoe"]["clip_qkv"] and olmoe.qk_norm_whole
    qwen2 = families.model_config(make_config("qwen2_moe", 100).to_dict())[1]
    assert qwen2.moe["sparse_layers"] == [1] and qwen2.moe["shared_expert_dim"] == 24
    assert not olmoe.moe["norm_topk"] and olmoe.moe["top_k"] == 3


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_transformers_fused_layout_loads_too(tmp_path, family):
    """A folder whose safetensors hold transformers 5.x's in-memory names (mlp.gate,
    mlp.experts.gate_up_proj / down_proj), not the released per-expert ones."""
    from safetensors.torch import save_file

    hf_model, tok = make_model(tmp_path / "released", family)
    fused = tmp_path / "fused"
    shutil.copytree(tmp_path / "released", fused)
    (fused / "model.safetensors").unlink()
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in state)
    save_file(state, fused / "model.safetensors")
    assert_logits_equal(load(fused).model, hf_model, tok(PROMPT)["input_ids"])


@pytest.mark.parametrize("family", [*MOE_FAMILIES, "gpt_oss"])
def test_aux_loss_equals_transformers_output_router_logits(tmp_path, family):
    hf_model, tok = make_model(
        tmp_path, family, output_router_logits=True, router_aux_loss_coef=0.05
    )
    x = torch.tensor([tok(PROMPT)["input_ids"]])
    with torch.no_grad():
        want = hf_model(x, labels=x)
    model = load(tmp_path).model
    assert model.config.moe["aux_coef"] == 0.05
    model.train()  # joined in training; dropout is 0
    targets = torch.roll(x, -1, 1)
    mask = torch.ones_like(x, dtype=torch.float32)
    mask[:, -1] = 0
    with torch.no_grad():
        _, loss = model(x, targets, mask)
    torch.testing.assert_close(model.router_aux_loss(), want.aux_loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(loss, want.loss, atol=1e-5, rtol=1e-5)
    # A padded batch (DPO's pairs, GRPO's rows): padding counts neither in transformers'
    # loss with an attention_mask nor in ours
    rows = torch.cat([x, x.roll(3, 1)])
    real = torch.ones_like(rows)
    real[1, -5:] = 0
    with torch.no_grad():
        want = hf_model(rows, attention_mask=real).aux_loss
        model(rows, torch.roll(rows, -1, 1), real.float(), real=real)
        padded = model.router_aux_loss()
        model(rows, torch.roll(rows, -1, 1), real.float())
    torch.testing.assert_close(padded, want, atol=1e-6, rtol=1e-6)
    assert (model.router_aux_loss() - want).abs() > 1e-4  # the padding counted otherwise


def test_top_k_over_the_expert_count_and_unbuilt_designs_are_one_line(tmp_path):
    make_model(tmp_path / "m", "mixtral")
    hf = json.loads((tmp_path / "m" / "config.json").read_text())
    with pytest.raises(UserError, match=r"num_experts_per_tok \(5\) must be .* count \(4\)"):
        families.model_config({**hf, "num_experts_per_tok": 5})
    deepseek = {**hf, "model_type": "deepseek_v3", "kv_lora_rank": 512, "n_group": 8}
    with pytest.raises(UserError, match="kv_lora_rank .*latent attention.* not supported"):
        families.model_config(deepseek)


def run_config(tmp_path, **extra):
    (tmp_path / "text.txt").write_text(TEXT * 3, encoding="utf-8")
    return tiny_config(
        init_from=str(tmp_path / "model"),
        tokenizer="model",
        lr=None,
        data=str(tmp_path / "text.txt"),
        max_steps=3,
        log_every=1,
        eval_every=3,
        ckpt_every=3,
        eval_batches=1,
        batch_size=2,
        grad_accum=2,
        dropout=0.0,
        sample_tokens=0,
        seq_len=16,
        **extra,
    )


def straight_and_resumed(tmp_path, cfg):
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(1))
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    Trainer(cfg, tmp_path / "split", resume_from=latest).run()
    straight = read_metrics(tmp_path / "straight" / "metrics.jsonl")[0]
    split = read_metrics(tmp_path / "split" / "metrics.jsonl")[0]
    assert [r["loss"] for r in split] == [r["loss"] for r in straight]
    assert [r["moe/expert_load"] for r in split] == [r["moe/expert_load"] for r in straight]
    return straight


def routers_moved(base, trained) -> bool:
    """Whether the trained model's routers differ from its base's (transformers models)."""
    before, after = base.state_dict(), trained.state_dict()
    routers = [k for k in before if k.endswith(("mlp.gate.weight", "mlp.router.weight"))]
    assert routers
    return any(not torch.equal(before[k], after[k]) for k in routers)


# The router is frozen unless --train-router: one family trains it, the others check it stays.
TRAIN_ROUTER = {"qwen3_moe": True}


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_full_fine_tuning_resumes_bitwise_and_exports_what_transformers_loads(tmp_path, family):
    from transformers import AutoModelForCausalLM

    base, tok = make_model(tmp_path / "model", family)
    router = TRAIN_ROUTER.get(family, False)
    cfg = run_config(tmp_path, router_aux_loss=0.01, train_router=router)
    records = straight_and_resumed(tmp_path, cfg)
    layers = load(tmp_path / "model").model.moe_layers
    for r in records:
        assert r["moe/layers"] == layers and r["moe/aux_loss"] > 0
        assert len(r["moe/expert_load"]) == len(layers)
        # shares are written with six decimals
        assert all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in r["moe/expert_load"])
        assert r["moe/router_entropy"] > 0
    export(tmp_path / "straight", "hf", tmp_path / "hf", which="latest")
    from safetensors.torch import load_file

    names = load_file(tmp_path / "hf" / "model.safetensors")
    assert any(".experts.0." in name for name in names)  # the released per-expert layout
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").float().eval()
    assert type(exported).__name__ == families.get(family).hf_arch
    assert routers_moved(base, exported) == router
    assert_logits_equal(load(tmp_path / "straight").model, exported, tok(PROMPT)["input_ids"])
    # GGUF: the stacked experts where llama.cpp's architecture runs this shape (test_llamacpp
    # proves them there); one line naming what it lacks, and no file, where it does not
    refused = GGUF_REFUSED.get(family)
    if refused is None:
        import gguf

        lines = []
        path = export(
            tmp_path / "straight", "gguf", tmp_path / "gguf", "latest", "f32", log=lines.append
        )
        reader = gguf.GGUFReader(str(path / "model.gguf"))
        names = {t.name for t in reader.tensors}
        assert {"blk.0.ffn_gate_inp.weight", "blk.0.ffn_up_exps.weight"} <= names
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        experts = load(tmp_path / "model").model.config.moe["n_experts"]
        assert reader.fields[f"{arch}.expert_count"].parts[-1][0] == experts
        # read back into the model (experts joined again), the file scores as the run does
        assert any(", +0.00%)" in line for line in lines if line.startswith("gguf f32:"))
        return
    with pytest.raises(ExportError, match=f"gguf: llama.cpp's .*{refused}"):
        export(tmp_path / "straight", "gguf", tmp_path / "gguf", which="latest")
    assert not (tmp_path / "gguf").exists()


# What each tiny model has that its llama.cpp architecture does not run (None: it exports)
GGUF_REFUSED = {
    "qwen3_moe": "dense layers",  # mlp_only_layers
    "qwen2_moe": "dense layers",  # decoder_sparse_step 2
    "olmoe": "num_key_value_heads",
}


def experts_moved(base, merged) -> bool:
    """Whether every expert's weights in the merged export differ from the base's (each
    expert's own adapter pair trained), or none do."""
    from safetensors.torch import load_file

    before = load_file(base / "model.safetensors")
    after = load_file(merged / "model.safetensors")
    moved = [not torch.equal(before[k], after[k]) for k in before if ".experts." in k]
    assert moved and (all(moved) or not any(moved))
    return all(moved)


# One LoRA form per family, so each runs once: on attention alone; with each expert's own
# adapters (--lora-experts); with the router trained too; on a 4-bit (NF4) base, experts
# included, whose export merges the adapters into the original weights.
LORA_RUNS = {
    "qwen3_moe": {"lora_experts": True, "train_router": True},
    "qwen2_moe": {},
    "mixtral": {"lora_experts": True},
    "olmoe": {"lora_experts": True, "base_bits": "4"},
    "qwen3_5_moe": {"lora_experts": True},  # the DeltaNet layers adapted too
}


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_lora_resumes_bitwise_and_exports_to_transformers_and_peft(tmp_path, family):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, tok = make_model(tmp_path / "model", family)
    extra = LORA_RUNS[family]
    cfg = run_config(tmp_path, lora_rank=4, lora_targets="attn", lora_alpha=64.0, **extra)
    straight_and_resumed(tmp_path, cfg)
    export(tmp_path / "straight", "hf", tmp_path / "merged", which="latest")
    export(tmp_path / "straight", "peft", tmp_path / "peft", which="latest")
    adapter = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert bool(adapter["target_parameters"]) == bool(extra.get("lora_experts"))
    assert bool(adapter["modules_to_save"]) == bool(extra.get("train_router"))
    assert experts_moved(tmp_path / "model", tmp_path / "merged") == bool(extra.get("lora_experts"))
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "model").float().eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").float().eval()
    assert routers_moved(base, merged) == bool(extra.get("train_router"))
    with torch.no_grad():
        want = merged(ids).logits
        assert (base(ids).logits - want).abs().max() > 1e-4  # the adapters changed it
        ours = load(tmp_path / "straight").model
        assert (ours.logits(ids) - want).abs().max() < 1e-4  # adapters apart: another sum order
        lora.merge(ours)  # the same weights as the export: equal to transformers at 1e-5
        assert (ours.logits(ids) - want).abs().max() < 1e-5
        adapted = PeftModel.from_pretrained(base, tmp_path / "peft").eval()
        assert (adapted(ids).logits - want).abs().max() < 1e-4


def test_the_info_line_counts_total_and_active_parameters(tmp_path):
    make_model(tmp_path, "mixtral")
    pre = open_pretrained(str(tmp_path))
    info = pre.info()
    assert info["active"] < info["parameters"]
    assert "M total, " in info_line(info) and "(2 of 4 experts a token)" in info_line(info)
