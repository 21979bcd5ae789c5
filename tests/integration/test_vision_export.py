"""The GGUF and Ollama exports of a Gemma 3 composite fine-tuned with images: the text GGUF,
the projector file (mmproj) holding the tower and projector as the hf export has them, and a
Modelfile with both FROMs. (That llama.cpp's mtmd sees images through them as transformers
does: tests/integration/test_vision_llamacpp.py, where llama-cpp-python is installed.)"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from helpers import tiny_config  # noqa: E402
from vision_models import colour_chat, make_gemma3_vision  # noqa: E402

from core.training.trainer import Trainer  # noqa: E402
from core.use import mmproj  # noqa: E402
from core.use.export import export  # noqa: E402

# llama.cpp's names of a few tower and projector tensors, and the end of the composite's
NAMES = {
    "v.blk.0.attn_q.weight": "encoder.layers.0.self_attn.q_proj.weight",
    "v.blk.1.ffn_down.weight": "encoder.layers.1.mlp.fc2.weight",
    "v.patch_embd.weight": "embeddings.patch_embedding.weight",
    "mm.input_projection.weight": "multi_modal_projector.mm_input_projection_weight",
}


def named(tensors: dict, end: str) -> torch.Tensor:
    """The one tensor whose name ends so (transformers' versions prefix them differently)."""
    (name,) = [n for n in tensors if n.endswith(end) and "language_model" not in n]
    return tensors[name]


def image_run(tmp_path, layers: int = 2, **fields):
    """A tiny Gemma 3 composite (saved by transformers 5: processor_config.json, no
    preprocessor_config.json) fine-tuned on chat data with images: (base folder, run).
    Six layers: the sixth attends globally, so the answers see the image and the tower has a
    gradient (two sliding layers over 8 tokens do not reach it)."""
    folder = tmp_path / "base"
    make_gemma3_vision(folder, layers=layers)
    data = colour_chat(tmp_path / "data", 8)
    cfg = tiny_config(
        init_from=str(folder),
        tokenizer="model",
        data=str(data),
        lr=3e-2,
        max_steps=2,
        eval_every=2,
        ckpt_every=2,
        dropout=0.0,
        sample_tokens=0,
        seq_len=40,
        **fields,
    )
    Trainer(cfg, tmp_path / "run").run()
    return folder, tmp_path / "run"


def mmproj_tensors(path) -> dict[str, torch.Tensor]:
    reader = gguf.GGUFReader(str(path))
    return {t.name: torch.from_numpy(t.data.copy()) for t in reader.tensors}


def hf_tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_the_ollama_export_of_an_image_fine_tune_holds_the_tower_and_both_froms(tmp_path):
    """LoRA on the language model, tower frozen: the Modelfile names the text GGUF and the
    mmproj; the mmproj's tower and projector are the hf export's (the base's), f32 as asked."""
    folder, run = image_run(tmp_path, lora_rank=4)
    said = []
    export(run, "ollama", tmp_path / "out", quant="f32", which="latest", log=said.append)
    export(run, "hf", tmp_path / "hf", which="latest")
    lines = (tmp_path / "out" / "Modelfile").read_text().splitlines()
    assert lines[:2] == ["FROM ./model.gguf", f"FROM ./{mmproj.NAME}"]
    assert any(line.startswith(f"mmproj: {mmproj.NAME}, ") for line in said)
    ours, hf, base = (
        mmproj_tensors(tmp_path / "out" / mmproj.NAME),
        hf_tensors(tmp_path / "hf"),
        hf_tensors(folder),
    )
    for name, end in NAMES.items():
        got = ours[name]
        assert got.dtype == torch.float32 and torch.equal(got, named(hf, end)), name
        assert torch.equal(named(hf, end), named(base, end)), name  # frozen: the base's


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_the_mmproj_holds_the_tower_and_projector_as_trained(tmp_path, lora_rank):
    """--train-vision: the mmproj is the hf export's trained tower and projector (merged
    adapters under LoRA), not the base's."""
    folder, run = image_run(
        tmp_path, layers=6, lora_rank=lora_rank, train_vision=True, warmup_steps=0
    )
    export(run, "gguf", tmp_path / "out", quant="f32", which="latest")
    export(run, "hf", tmp_path / "hf", which="latest")
    ours = mmproj_tensors(tmp_path / "out" / mmproj.NAME)
    hf, base = hf_tensors(tmp_path / "hf"), hf_tensors(folder)
    for name, end in NAMES.items():
        assert torch.equal(ours[name], named(hf, end)), name
        if lora_rank and name == "v.patch_embd.weight":
            continue  # a convolution: no adapter, as it came
        assert not torch.equal(named(hf, end), named(base, end)), name
