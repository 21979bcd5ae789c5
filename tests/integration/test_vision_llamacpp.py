"""A Gemma 3 composite fine-tuned with images, in llama.cpp itself (llama-cpp-python's mtmd
bindings, llama_cpp.mtmd_cpp): the ollama export's projector file and text GGUF, loaded by
mtmd beside each other, embed an image as transformers' composite of the hf export does and
give its first greedy token after a chat prompt with the image. llama-cpp-python builds from
source (about 20 minutes on 2 cores), so this runs where it is installed and skips elsewhere."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
llama_cpp = pytest.importorskip("llama_cpp")
mtmd = pytest.importorskip("llama_cpp.mtmd_cpp")

from helpers import tiny_config  # noqa: E402
from test_composites import mtmd_embeddings  # noqa: E402
from vision_models import (  # noqa: E402
    IMAGE_SIZE,
    conversation,
    inputs_of,
    make_gemma3_vision,
    reloaded,
    save_image,
)

from core.training.trainer import Trainer  # noqa: E402
from core.use import mmproj  # noqa: E402
from core.use.export import export  # noqa: E402


def trained(tmp_path):
    """A tiny Gemma 3 composite after a LoRA fine-tune on chat data with images: (base
    folder, processor, run folder)."""
    folder = tmp_path / "base"
    _, processor = make_gemma3_vision(folder)
    data = tmp_path / "data"
    lines = []
    for i in range(12):
        save_image(data / f"{i % 2}.png", "png", (40, 30), i % 2)
        answer = "red circle" if i % 2 else "blue square"
        lines.append(json.dumps({"messages": conversation(f"{i % 2}.png", answer=answer)}))
    (data / "chat.jsonl").write_text("\n".join(lines), encoding="utf-8")
    cfg = tiny_config(
        init_from=str(folder),
        tokenizer="model",
        data=str(data / "chat.jsonl"),
        lora_rank=4,
        lr=3e-2,
        max_steps=4,
        eval_every=4,
        ckpt_every=4,
        dropout=0.0,
        sample_tokens=0,
        seq_len=48,
    )
    Trainer(cfg, tmp_path / "run").run()
    return folder, processor, tmp_path / "run"


def llama_logits(text_gguf, projector, image: np.ndarray, ids: list[int], image_token: int):
    """llama.cpp's last logits after ids, the run of image_token in them replaced by mtmd's
    embedding of image (decoded as mtmd decodes an image: non-causal for Gemma 3)."""
    first = ids.index(image_token)
    last = len(ids) - ids[::-1].index(image_token)
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(text_gguf).encode(), llama_cpp.llama_model_default_params()
    )
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_threads = 128, 128, 1
    lctx = llama_cpp.llama_init_from_model(model, cparams)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings, params.warmup = False, 1, False, False
    ctx = mtmd.mtmd_init_from_file(str(projector).encode(), model, params)
    assert ctx and lctx
    try:

        def decode(tokens):
            arr = (llama_cpp.llama_token * len(tokens))(*tokens)
            assert (
                llama_cpp.llama_decode(lctx, llama_cpp.llama_batch_get_one(arr, len(tokens))) == 0
            )

        decode(ids[:first])  # <bos> ... <start_of_image>
        data = (ctypes.c_uint8 * image.size).from_buffer_copy(image.tobytes())
        bitmap = mtmd.mtmd_bitmap_init(image.shape[1], image.shape[0], data)
        chunks = mtmd.mtmd_input_chunks_init()
        marker = mtmd.mtmd_default_marker()
        text = mtmd.mtmd_input_text(marker, len(marker), False, True)
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
        chunk = next(
            c
            for i in range(mtmd.mtmd_input_chunks_size(chunks))
            if mtmd.mtmd_input_chunk_get_type(c := mtmd.mtmd_input_chunks_get(chunks, i)) != 0
        )
        assert mtmd.mtmd_input_chunk_get_n_tokens(chunk) == last - first
        assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
        n_past = llama_cpp.llama_pos(0)
        embd = mtmd.mtmd_get_output_embd(ctx)
        no_callback = mtmd.mtmd_helper_post_decode_callback()  # NULL: nothing after each batch
        assert (
            mtmd.mtmd_helper_decode_image_chunk(
                ctx, lctx, chunk, embd, first, 0, 128, ctypes.byref(n_past), no_callback, None
            )
            == 0
        )
        assert n_past.value == last
        decode(ids[last:])  # <end_of_image> ... the model's turn
        vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        logits = llama_cpp.llama_get_logits_ith(lctx, -1)
        out = np.ctypeslib.as_array(logits, shape=(vocab,)).copy()
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
        return out
    finally:
        mtmd.mtmd_free(ctx)
        llama_cpp.llama_free(lctx)
        llama_cpp.llama_model_free(model)


def test_llama_cpp_mtmd_sees_an_image_as_transformers_after_image_training(tmp_path):
    """After a LoRA fine-tune on images: the ollama export (text GGUF, mmproj, a Modelfile
    with both FROMs) in llama.cpp's mtmd gives transformers' image embedding (the tolerance of
    tests/integration/test_composites.py), the same last logits within llama.cpp's arithmetic
    (tests/integration/test_llamacpp.py's) and the same first greedy token."""
    from PIL import Image

    folder, processor, run = trained(tmp_path)
    export(run, "ollama", tmp_path / "out", quant="f32", which="latest")
    export(run, "hf", tmp_path / "hf", which="latest")
    out = tmp_path / "out"
    lines = (out / "Modelfile").read_text().splitlines()
    assert lines[:2] == ["FROM ./model.gguf", f"FROM ./{mmproj.NAME}"]
    merged = reloaded(tmp_path / "hf")
    # a picture at the tower's size, which llama.cpp and transformers take as it is
    path = save_image(tmp_path / "pic.png", "png", (IMAGE_SIZE, IMAGE_SIZE), 1)
    image = np.asarray(Image.open(path).convert("RGB"))
    pixels = torch.tensor(image).permute(2, 0, 1)[None].float() / 127.5 - 1  # mean, std 0.5
    inputs = inputs_of(processor, conversation(path), [path])
    assert torch.allclose(inputs["pixel_values"], pixels, atol=1e-6)  # the processor's too
    with torch.no_grad():
        want = merged.get_image_features(pixel_values=pixels).pooler_output
        want = (want[0] if isinstance(want, list | tuple) else want).reshape(-1, 32).numpy()
        logits = merged(**inputs).logits[0, -1].numpy()
    embedded = mtmd_embeddings(out / "model.gguf", out / mmproj.NAME, [image])[0]
    print(f"mtmd image embedding against transformers: {np.abs(embedded - want).max():.4f}")
    assert embedded.shape == want.shape and np.abs(embedded - want).max() < 0.05

    ids = inputs["input_ids"][0].tolist()
    token = merged.config.image_token_index
    theirs = llama_logits(out / "model.gguf", out / mmproj.NAME, image, ids, token)[: len(logits)]
    print(f"last logits against transformers: {np.abs(theirs - logits).max():.4f}")
    assert np.abs(theirs - logits).max() < 0.05 * max(1.0, np.abs(logits).std())
    assert int(theirs.argmax()) == int(logits.argmax())
