"""gpt-oss: a tiny GptOssConfig model (experts with biases and the clamped SwiGLU, top-k
softmax routing, attention sinks, alternating sliding and full layers, YaRN) loads with logits
equal to transformers' in fp32, from a dequantized folder and from one with MXFP4 experts;
its hf export loads back in transformers equal; full fine-tuning trains and resumes bit for
bit."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import StopAfter, cached_forward, tiny_config  # noqa: E402
from hf_models import TEXT, make_model, mxfp4_pack  # noqa: E402

from core.models.model import GPT  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.use.common import ExportError  # noqa: E402
from core.use.export import export  # noqa: E402
from core.weights.loader import load, open_pretrained  # noqa: E402

PROMPT = "def add(a, b): hello world 12 The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt_oss") / "model"
    hf, tok = make_model(folder, "gpt_oss")
    return folder, hf, tok


def ids_of(tok, n=None):
    ids = tok(PROMPT)["input_ids"]
    return torch.tensor([ids[:n] if n else ids])


def test_logits_equal_transformers_and_the_clamp_bites(base):
    folder, hf, tok = base
    loaded = load(folder)
    c = loaded.model.config
    assert loaded.family == "gpt_oss" and c.attn_sinks and c.moe["router"] == "topk_softmax"
    x = ids_of(tok)
    assert x.shape[1] > 2 * c.sliding_window
    with torch.no_grad():
        want = hf(x).logits
    got = loaded.model.logits(x)
    assert (got - want).abs().max() < 1e-5
    # One token at a time: the softmax (fp32) over rows of other lengths rounds otherwise,
    # and this tiny model's wide init (0.3) grows that to some 3e-5; in fp64 the two paths
    # agree to 2e-15.
    assert (cached_forward(loaded.model, x, 5) - want).abs().max() < 1e-4
    # the clamp at swiglu_limit changes what these weights compute
    wide = dataclasses.replace(c, moe={**c.moe, "swiglu_limit": 1e6})
    unclamped = GPT(wide).eval()
    unclamped.load_state_dict(loaded.model.state_dict())
    with torch.no_grad():
        assert (unclamped.logits(x) - want).abs().max() > 1e-3


def mxfp4_folder(folder, out):
    """folder's model with its experts in MXFP4 (*_blocks, *_scales of [E, rows, cols] as
    released checkpoints hold them) and what transformers dequantizes them to."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    out.mkdir()
    for f in folder.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    state = load_file(folder / "model.safetensors")
    dequantized = {}
    for name in [n for n in state if n.endswith(("gate_up_proj", "down_proj"))]:
        blocks, scales = mxfp4_pack(state.pop(name).transpose(1, 2).contiguous())
        state[name + "_blocks"], state[name + "_scales"] = blocks, scales
        dequantized[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    save_file(state, out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (out / "config.json").write_text(json.dumps(config))
    return dequantized


def test_an_mxfp4_checkpoint_loads_as_transformers_dequantizes_it(base, tmp_path):
    folder, hf, tok = base
    dequantized = mxfp4_folder(folder, tmp_path / "mxfp4")
    reference = type(hf)(hf.config).eval()
    reference.load_state_dict({**hf.state_dict(), **dequantized})
    x = ids_of(tok)
    with torch.no_grad():
        want = reference(x).logits
        assert (want - hf(x).logits).abs().max() > 1e-4  # the 4-bit rounding shows
    assert "MXFP4 experts are dequantized" in open_pretrained(tmp_path / "mxfp4").info()["notes"][0]
    for mapped in (False, True):  # the export path reads the files memory-mapped
        loaded = load(tmp_path / "mxfp4", mapped=mapped)
        model = loaded.model
        if mapped:
            model = GPT(model.config).eval()
            model.load_state_dict(load(tmp_path / "mxfp4").model.state_dict())
        assert (model.logits(x) - want).abs().max() < 1e-5
    # its hf export holds the dequantized experts, without the MXFP4 quantization_config
    from transformers import AutoModelForCausalLM

    export(tmp_path / "mxfp4", "hf", tmp_path / "out")
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert (back(x).logits - want).abs().max() < 1e-5


def test_a_damaged_mxfp4_pair_is_one_line_naming_tensor_and_file(base, tmp_path):
    from safetensors.torch import load_file, save_file

    from core.weights.mxfp4 import MXFP4Error

    folder, _, _ = base
    mxfp4_folder(folder, tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    state = load_file(path)
    name = "model.layers.1.mlp.experts.down_proj_scales"
    good = state[name]
    state[name] = good.clone()
    state[name][0, 0, 0] = 255  # E8M0's NaN
    save_file(state, path)
    with pytest.raises(MXFP4Error) as e:  # read when the weights load
        load(tmp_path / "m")
    assert f"{path}: tensor {name} holds the exponent 128" in str(e.value)
    state[name] = good[:, :, :0].contiguous()  # the wrong shape: refused from the header
    save_file(state, path)
    with pytest.raises(MXFP4Error, match=f"{path}: tensor {name} has shape"):
        open_pretrained(tmp_path / "m")


def test_hf_export_loads_back_in_transformers_equal(base, tmp_path):
    from transformers import AutoModelForCausalLM

    folder, hf, tok = base
    export(folder, "hf", tmp_path / "out")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back).__name__ == "GptOssForCausalLM"
    x = ids_of(tok)
    with torch.no_grad():
        assert (back(x).logits - hf(x).logits).abs().max() < 1e-5
    for name, tensor in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


@pytest.mark.slow  # three short runs: about 15 s on a busy 2-core machine
def test_full_fine_tuning_trains_and_resumes_bit_for_bit(base, tmp_path):
    folder, _, _ = base
    (tmp_path / "text.txt").write_text(TEXT * 5, encoding="utf-8")
    cfg = tiny_config(
        init_from=str(folder),
        tokenizer="model",
        lr=None,
        data=str(tmp_path / "text.txt"),
        max_steps=2,
        eval_every=2,
        eval_batches=1,
        ckpt_every=1,
        log_every=1,
        batch_size=2,
        hidden_dim=32,
        n_heads=4,
        bias=False,
        dropout=0.0,
        sample_tokens=0,
        seq_len=16,
    )
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(1))
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    Trainer(cfg, tmp_path / "split", resume_from=latest).run()
    straight = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    split = read_metrics(tmp_path / "split" / "metrics.jsonl")
    assert [r["loss"] for r in split[0]] == [r["loss"] for r in straight[0]]
    assert len(straight[0]) == 2 and len(split[0]) == 2
    first = torch.load(latest, weights_only=True)
    assert any(k.endswith("attn.sinks") for k in first["model"])
    assert straight[0][0]["moe/layers"] == [0, 1, 2, 3]  # the experts' load is recorded
    with pytest.raises(ExportError, match="gguf: llama.cpp's gpt-oss fixes swiglu_limit at 7.0"):
        export(tmp_path / "straight", "gguf", tmp_path / "gguf", which="latest")


@pytest.mark.slow  # three short runs and two exports
def test_lora_on_attention_and_experts_exports_to_transformers_and_peft(base, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder, _, tok = base
    (tmp_path / "text.txt").write_text(TEXT * 3, encoding="utf-8")
    cfg = tiny_config(
        init_from=str(folder),
        tokenizer="model",
        lr=None,
        data=str(tmp_path / "text.txt"),
        max_steps=2,
        eval_every=2,
        eval_batches=1,
        ckpt_every=2,
        batch_size=2,
        dropout=0.0,
        sample_tokens=0,
        seq_len=16,
        lora_rank=4,
        lora_targets="attn",
        lora_alpha=64.0,
        lora_experts=True,  # its interleaved [E, H, 2I] experts in PEFT's layout
        train_router=True,  # its router's weight and bias as modules_to_save
    )
    Trainer(cfg, tmp_path / "run").run()
    export(tmp_path / "run", "hf", tmp_path / "merged", which="latest")
    export(tmp_path / "run", "peft", tmp_path / "peft", which="latest")
    x = ids_of(tok)
    base_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        want = merged(x).logits
        assert (base_model(x).logits - want).abs().max() > 1e-4  # the adapters changed it
        adapted = PeftModel.from_pretrained(base_model, tmp_path / "peft").eval()
        assert (adapted(x).logits - want).abs().max() < 1e-4
        ours = load(tmp_path / "run").model.logits(x)
    assert (ours - want).abs().max() < 1e-4
