"""Composite checkpoints (a ...ForConditionalGeneration with vision/audio towers) fine-tuned on
text: the language model loads equal to the composite's on text and trains; the hf export is
the whole original class with the towers' tensors bitwise as they came and the trained
language model (LoRA merged); the peft adapter on the composite class equals it. One case a
composite builder of tests/hf_models.py; a family not built yet skips."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config  # noqa: E402
from hf_models import COMPOSITES, TEXT  # noqa: E402

from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.weights import composite, families  # noqa: E402
from core.weights.loader import info_line, load, open_pretrained  # noqa: E402

PROMPT = "def add(a, b): hello world 12 The quick brown fox jumps over the lazy dog."


def tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def make(tmp_path, family):
    if family not in families.FAMILIES:
        pytest.skip(f"no {family} family on this branch yet")
    return COMPOSITES[family](tmp_path / "base")


@pytest.mark.parametrize("family", COMPOSITES)
def test_a_composite_trains_its_language_model_and_exports_the_whole_class(tmp_path, family):
    from peft import PeftModel

    model, tok = make(tmp_path, family)
    pre = open_pretrained(tmp_path / "base")
    line = info_line(pre.info())
    kinds = " and ".join(composite.towers(pre.hf_config))
    assert pre.family == family and line.split("\n")[0].endswith(f", {kinds} kept")
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    with torch.no_grad():  # text in: the language model alone gives the composite's logits
        before = model(input_ids=ids).logits
        assert (load(tmp_path / "base").model(ids)[0] - before).abs().max() < 1e-5

    (tmp_path / "text.txt").write_text(TEXT * 3, encoding="utf-8")
    cfg = tiny_config(
        init_from=str(tmp_path / "base"),
        tokenizer="model",
        data=str(tmp_path / "text.txt"),
        lora_rank=4,
        lr=3e-2,
        max_steps=3,
        eval_every=3,
        ckpt_every=3,
        dropout=0.0,
        sample_tokens=0,
        seq_len=24,
    )
    Trainer(cfg, tmp_path / "run").run()
    export(tmp_path / "run", "hf", tmp_path / "hf", which="latest")
    export(tmp_path / "run", "peft", tmp_path / "peft", which="latest")

    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == [type(model).__name__]
    assert (tmp_path / "hf" / "preprocessor_config.json").is_file()
    base, out = tensors(tmp_path / "base"), tensors(tmp_path / "hf")
    kept = [n for n in base if composite.text_name(n) is None]
    assert kept and set(out) == set(base)  # the whole class, under the base's own names
    for name in kept:  # bitwise, in their own dtype
        assert out[name].dtype == base[name].dtype and torch.equal(out[name], base[name]), name
    merged = type(model).from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        want = merged(input_ids=ids).logits
        assert (want - before).abs().max() > 1e-3  # training changed the language model
        ours = load(tmp_path / "run", "latest").model(ids)[0]
        assert (ours - want).abs().max() < 1e-4
        adapted = PeftModel.from_pretrained(model, tmp_path / "peft").eval()
        assert (adapted(input_ids=ids).logits - want).abs().max() < 1e-4
