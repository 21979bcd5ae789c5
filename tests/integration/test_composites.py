"""Composite checkpoints (a ...ForConditionalGeneration with vision/audio towers) fine-tuned on
text: the language model loads equal to the composite's on text and trains; the hf export is
the whole original class with the towers' tensors bitwise as they came and the trained
language model (LoRA merged); the peft adapter on the composite class equals it. One case a
composite builder of tests/hf_models.py; a family not built yet skips."""

from __future__ import annotations

import copy
import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers import float32_rounding, tiny_config  # noqa: E402
from hf_models import COMPOSITES, TEXT  # noqa: E402

from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.weights import composite, families  # noqa: E402
from core.weights.loader import info_line, load, open_pretrained  # noqa: E402

# The families whose text GGUF is written: their projector test goes through the ollama export
# (where the family is there; Qwen3.5's text GGUF is not written yet).
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
    assert pre.family == family and f"), {kinds} kept, " in line.split("\n")[0]
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    # Text in: the language model alone gives the composite's logits, to float32's rounding
    # of them (measured against float64: Qwen3.5's delta rule amplifies it, to 2e-5 here)
    with torch.no_grad():
        before = model(input_ids=ids).logits
        rounding = float32_rounding(before, copy.deepcopy(model).double()(input_ids=ids).logits)
        assert (load(tmp_path / "base").model.logits(ids) - before).abs().max() < 4 * rounding

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
        ours = load(tmp_path / "run", "latest").model.logits(ids)
        assert (ours - want).abs().max() < 1e-4
        adapted = PeftModel.from_pretrained(model, tmp_path / "peft").eval()
        assert (adapted(input_ids=ids).logits - want).abs().max() < 1e-4


def mtmd_embeddings(text_gguf, mmproj, media) -> list:
    """llama.cpp's mtmd (llama-cpp-python): the projector file loaded beside a text GGUF,
    each media item (an RGB uint8 image, or float audio samples) encoded: [tokens, width]."""
    import ctypes

    import numpy as np

    llama_cpp = pytest.importorskip("llama_cpp")
    m = pytest.importorskip("llama_cpp.mtmd_cpp")
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(text_gguf).encode(), llama_cpp.llama_model_default_params()
    )
    params = m.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings, params.warmup = False, 1, False, False
    ctx = m.mtmd_init_from_file(str(mmproj).encode(), model, params)
    assert ctx, f"mtmd did not load {mmproj}"
    width = llama_cpp.llama_model_n_embd(model)
    out = []
    try:
        for item in media:
            if item.dtype == np.uint8:
                data = (ctypes.c_uint8 * item.size).from_buffer_copy(item.tobytes())
                bitmap = m.mtmd_bitmap_init(item.shape[1], item.shape[0], data)
            else:
                data = (ctypes.c_float * item.size).from_buffer_copy(item.tobytes())
                bitmap = m.mtmd_bitmap_init_from_audio(item.size, data)
            chunks = m.mtmd_input_chunks_init()
            marker = m.mtmd_default_marker()
            text = m.mtmd_input_text(marker, len(marker), False, True)
            bitmaps = (m.mtmd_bitmap_p_ctypes * 1)(bitmap)
            assert m.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
            for i in range(m.mtmd_input_chunks_size(chunks)):
                chunk = m.mtmd_input_chunks_get(chunks, i)
                if m.mtmd_input_chunk_get_type(chunk) != 0:  # not text: the media's
                    assert m.mtmd_encode_chunk(ctx, chunk) == 0
                    n = m.mtmd_input_chunk_get_n_tokens(chunk)
                    embd = m.mtmd_get_output_embd(ctx)
                    out.append(np.ctypeslib.as_array(embd, shape=(n * width,)).reshape(n, width))
                    out[-1] = out[-1].copy()
            m.mtmd_input_chunks_free(chunks)
            m.mtmd_bitmap_free(bitmap)
    finally:
        m.mtmd_free(ctx)
        llama_cpp.llama_model_free(model)
    return out


@pytest.mark.parametrize("family", COMPOSITES)
def test_the_projector_file_loads_in_llama_cpp_mtmd_and_embeds_an_image(tmp_path, family):
    """The mmproj as llama.cpp's converter writes it: mtmd loads it beside the text GGUF and
    embeds an image (and a clip of audio where the class has an audio tower). The image goes in
    at a size llama.cpp keeps: its embedding equals transformers' image features."""
    import numpy as np

    pytest.importorskip("llama_cpp")
    from core.use import mmproj

    model, _ = COMPOSITES[family](tmp_path / "base")
    hf = json.loads((tmp_path / "base" / "config.json").read_text())
    said = []  # the ollama export: text GGUF, mmproj and a Modelfile naming both
    export(tmp_path / "base", "ollama", tmp_path / "out", quant="f32", log=said.append)
    assert f"llama-server -m model.gguf --mmproj {mmproj.NAME}" in "\n".join(said)
    text, proj = tmp_path / "out" / "model.gguf", tmp_path / "out" / mmproj.NAME
    lines = (tmp_path / "out" / "Modelfile").read_text().splitlines()
    assert lines[:2] == ["FROM ./model.gguf", f"FROM ./{mmproj.NAME}"]
    size = IMAGE_SIZE.get(family, 56)
    image = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    media = [image]
    if "audio" in composite.towers(hf):  # one second of a 440 Hz tone at 16 kHz
        media.append(np.sin(np.arange(16000, dtype=np.float32) * 2 * np.pi * 440 / 16000))
    embedded = mtmd_embeddings(text, proj, media)
    assert len(embedded) == len(media)
    for e in embedded:
        assert e.shape[0] > 0 and e.shape[1] == 32 and np.isfinite(e).all() and e.std() > 0.1
    want = image_features(family, model, image)
    if want is not None:  # llama.cpp's f32 graph against torch's: values up to about 6
        print(f"{family}: mtmd against transformers {np.abs(embedded[0] - want).max():.4f}")
        assert embedded[0].shape == want.shape and np.abs(embedded[0] - want).max() < 0.05


# Image sizes llama.cpp takes as they are (Gemma 3: its tower's; Qwen3.5: a multiple of
# patch x merge above its least pixels; Gemma 4: 27 x 27 patches of 14, pooled 3 x 3), so
# transformers can be given the same pixels.
IMAGE_SIZE = {"gemma3": 56, "qwen3_5": 84, "gemma4": 378}


def image_features(family, model, image):
    """transformers' image embedding of the same pixels (no resize), or None."""
    import transformers

    if family == "gemma3":  # mean and std 0.5
        pixels = torch.tensor(image).permute(2, 0, 1)[None].float() / 127.5 - 1
        inputs = {"pixel_values": pixels}
    elif family == "qwen3_5":  # patches in the merger's order, two frames
        proc = transformers.Qwen2VLImageProcessorPil(
            patch_size=14,
            temporal_patch_size=2,
            merge_size=2,
            do_resize=False,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        )
        inputs = dict(proc(images=[image], return_tensors="pt"))
    elif family == "gemma4":  # patches with their positions, pooled 3 x 3
        proc = transformers.Gemma4ImageProcessorPil(
            patch_size=14,
            pooling_kernel_size=3,
            do_resize=False,
            do_normalize=True,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
        )
        inputs = dict(proc(images=[image], return_tensors="pt"))
        inputs.pop("num_soft_tokens_per_image")
    else:
        return None
    with torch.no_grad():
        out = model.get_image_features(**inputs).pooler_output
    return (out[0] if isinstance(out, list | tuple) else out).reshape(-1, 32).numpy()


def test_a_composite_of_unknown_towers_trains_its_text_and_keeps_the_rest(tmp_path):
    """A class TrainDeck knows only the language model of (a Llama here): it loads and says
    what it keeps; hf writes the kept tensors back bitwise beside the language model under
    the composite's names; gguf writes the text model alone and says why in one line."""
    from hf_models import make_model
    from safetensors.torch import save_file

    make_model(tmp_path / "llama", "llama")
    folder = tmp_path / "base"
    folder.mkdir()
    for f in (tmp_path / "llama").iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            (folder / f.name).write_bytes(f.read_bytes())
    text = tensors(tmp_path / "llama")
    tower = {"model.foo_tower.proj.weight": torch.randn(8, 5).bfloat16()}
    save_file(
        {**{composite.full_name(n): t for n, t in text.items()}, **tower},
        str(folder / "model.safetensors"),
    )
    config = {
        "architectures": ["FooVLForConditionalGeneration"],
        "model_type": "foo_vl",
        "text_config": json.loads((tmp_path / "llama" / "config.json").read_text()),
        "vision_config": {"hidden_size": 8},
    }
    (folder / "config.json").write_text(json.dumps(config))
    assert info_line(open_pretrained(folder).info()).startswith("Llama (llama), vision kept, ")
    lines = []
    export(folder, "gguf", tmp_path / "gguf", quant="f32", log=lines.append)
    assert [p.name for p in (tmp_path / "gguf").iterdir()] == ["model.gguf"]
    assert "mmproj: llama.cpp has no projector for FooVLForConditionalGeneration's towers" in (
        "\n".join(lines)
    )
    export(folder, "hf", tmp_path / "hf")
    out = tensors(tmp_path / "hf")
    assert torch.equal(out["model.foo_tower.proj.weight"], tower["model.foo_tower.proj.weight"])
    assert out["model.foo_tower.proj.weight"].dtype == torch.bfloat16
    for name, t in text.items():  # not trained: the language model as it came
        assert torch.equal(out[composite.full_name(name)], t), name
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [
        "FooVLForConditionalGeneration"
    ]


def test_a_projector_without_its_image_settings_is_refused_before_writing(tmp_path):
    """llama.cpp's projector file needs the image mean and std (preprocessor_config.json):
    without them the gguf export is one line naming the file, and nothing is written."""
    from core.use.common import ExportError

    COMPOSITES["gemma3"](tmp_path / "base")
    (tmp_path / "base" / "preprocessor_config.json").unlink()
    with pytest.raises(ExportError) as e:
        export(tmp_path / "base", "gguf", tmp_path / "gguf")
    assert "has no preprocessor_config.json with image_mean and image_std" in str(e.value)
    assert not (tmp_path / "gguf").exists()


def test_a_tower_llama_cpp_would_run_otherwise_gets_no_projector_and_one_line():
    """Shapes llama.cpp's graph fixes (Gemma 4 pools 3x3 patches, Qwen3.5 takes 2 frames):
    another one writes no projector (the text GGUF alone) and says why."""
    from core.use import mmproj

    def config(arch, **vision):
        return {"architectures": [arch], "text_config": {}, "vision_config": vision}

    gemma4 = config("Gemma4ForConditionalGeneration", pooling_kernel_size=2)
    qwen = config("Qwen3_5ForConditionalGeneration", temporal_patch_size=3)
    assert mmproj.missing_line(gemma4) == (
        "mmproj: not written: llama.cpp's gemma4v pools 3x3 patches, this tower 2x2; the GGUF "
        "holds the text model alone"
    )
    assert "reads a temporal patch of 2, this tower 3" in mmproj.missing_line(qwen)
    for fine in (
        config("Gemma4ForConditionalGeneration", pooling_kernel_size=3),
        config("Qwen3_5ForConditionalGeneration", temporal_patch_size=2),
    ):
        assert mmproj.missing_line(fine) is None
