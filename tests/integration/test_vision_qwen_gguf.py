"""The Ollama (GGUF) export of Qwen3-VL and Qwen3.5 composites fine-tuned with images and
--train-vision: the text GGUF (qwen3vl / qwen35, M-RoPE sections, Qwen3-VL's DeepStack count)
and the projector file (qwen3vl_merger) as llama.cpp's converter writes them from the hf
export (Conv3d patch split in two frames, DeepStack mergers at their tower blocks), holding
the tower as trained, and a Modelfile with both FROMs. Where llama-cpp-python is installed,
llama.cpp's mtmd embeds an image as transformers' composite of the hf export does (DeepStack's
features beside the merger's) and gives its last logits after a chat prompt with the image."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from helpers import tiny_config  # noqa: E402
from test_vision_export import hf_tensors, mmproj_tensors  # noqa: E402
from vision_models import (  # noqa: E402
    colour_chat,
    make_qwen_vision,
    qwen_inputs,
    qwen_reloaded,
    save_image,
)

from core.training.trainer import Trainer  # noqa: E402
from core.use import mmproj  # noqa: E402
from core.use.export import export  # noqa: E402

SIDE = 48  # the tiny processor's largest image: 3 x 3 tokens, which llama.cpp keeps as it is
ARCH = {"qwen3_vl": "qwen3vl", "qwen3_5": "qwen35"}


@pytest.fixture(scope="module", params=list(ARCH))
def exported(request, tmp_path_factory):
    """(kind, base folder, processor, tokenizer, hf export, ollama export) of a full fine-tune
    with --train-vision on chat data with images."""
    from transformers import AutoTokenizer

    kind, tmp = request.param, tmp_path_factory.mktemp(request.param)
    folder = tmp / "base"
    _, processor = make_qwen_vision(folder, kind)
    data = colour_chat(tmp / "data", 6)
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
        seq_len=48,
        train_vision=True,
        warmup_steps=0,
    )
    Trainer(cfg, tmp / "run").run()
    export(tmp / "run", "hf", tmp / "hf", which="latest")
    export(tmp / "run", "ollama", tmp / "out", quant="f32", which="latest")
    tok = AutoTokenizer.from_pretrained(folder)
    return kind, folder, processor, tok, tmp / "hf", tmp / "out"


def visual(tensors: dict, end: str) -> torch.Tensor:
    (name,) = [n for n in tensors if n.endswith(f"visual.{end}")]
    return tensors[name]


def fields(path) -> dict:
    return {k: f.contents() for k, f in gguf.GGUFReader(str(path)).fields.items()}


def test_the_text_gguf_and_mmproj_are_the_converters_and_hold_the_trained_tower(exported):
    kind, folder, _, _, hf_folder, out = exported
    assert (out / "Modelfile").read_text().splitlines()[:2] == [
        "FROM ./model.gguf",
        f"FROM ./{mmproj.NAME}",
    ]
    hf = json.loads((hf_folder / "config.json").read_text())
    text = fields(out / "model.gguf")
    arch = ARCH[kind]
    assert text["general.architecture"] == arch
    sections = hf["text_config"]["rope_parameters"].get("mrope_section")
    if kind == "qwen3_vl":  # the converter: text_config's sections padded to four, DeepStack
        assert text[f"{arch}.rope.dimension_sections"] == [*sections, 0]
        deep = hf["vision_config"]["deepstack_visual_indexes"]
        assert text[f"{arch}.n_deepstack_layers"] == len(deep)
    proj = fields(out / mmproj.NAME)
    assert proj["clip.projector_type"] == "qwen3vl_merger"
    assert proj["clip.vision.block_count"] == hf["vision_config"]["depth"]
    deep = hf["vision_config"].get("deepstack_visual_indexes", [])
    want_deep = [i in deep for i in range(hf["vision_config"]["depth"])]
    assert proj.get("clip.vision.is_deepstack_layers", [False] * len(want_deep)) == want_deep

    ours, trained, base = mmproj_tensors(out / mmproj.NAME), hf_tensors(hf_folder), None
    base = hf_tensors(folder)
    conv = visual(trained, "patch_embed.proj.weight")  # (out, 3, 2 frames, p, p)
    pairs = {
        "v.patch_embd.weight": conv[:, :, 0],
        "v.patch_embd.weight.1": conv[:, :, 1],
        "v.blk.1.attn_qkv.weight": visual(trained, "blocks.1.attn.qkv.weight"),
        "v.position_embd.weight": visual(trained, "pos_embed.weight"),
        "mm.0.weight": visual(trained, "merger.linear_fc1.weight"),
        "mm.2.weight": visual(trained, "merger.linear_fc2.weight"),
        "v.post_ln.weight": visual(trained, "merger.norm.weight"),
    }
    for i, block in enumerate(deep):  # DeepStack mergers under their tower block's number
        pairs[f"v.deepstack.{block}.fc1.weight"] = visual(
            trained, f"deepstack_merger_list.{i}.linear_fc1.weight"
        )
    for name, want in pairs.items():
        assert ours[name].shape == want.shape and torch.equal(ours[name], want), name
    trained_qkv = visual(trained, "blocks.1.attn.qkv.weight")
    assert not torch.equal(trained_qkv, visual(base, "blocks.1.attn.qkv.weight"))  # it trained


def mtmd_run(text_gguf, projector, image: np.ndarray, ids: list[int], image_token: int):
    """llama.cpp with mtmd: (its image embedding rows, its last logits after ids with the run
    of image_token replaced by the image), the text after the image at the positions mtmd
    gives it (M-RoPE: the image advances them by its larger side in tokens)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    m = pytest.importorskip("llama_cpp.mtmd_cpp")
    first = ids.index(image_token)
    last = len(ids) - ids[::-1].index(image_token)
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(text_gguf).encode(), llama_cpp.llama_model_default_params()
    )
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_threads = 128, 128, 1
    lctx = llama_cpp.llama_init_from_model(model, cparams)
    params = m.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings, params.warmup = False, 1, False, False
    ctx = m.mtmd_init_from_file(str(projector).encode(), model, params)
    assert ctx and lctx
    try:
        n_past = llama_cpp.llama_pos(0)
        batch = llama_cpp.llama_batch_init(128, 0, 1)

        def decode(tokens):  # at explicit positions from n_past on
            batch.n_tokens = len(tokens)
            for i, token in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, n_past.value + i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, i == len(tokens) - 1
            assert llama_cpp.llama_decode(lctx, batch) == 0
            n_past.value += len(tokens)

        decode(ids[:first])
        data = (ctypes.c_uint8 * image.size).from_buffer_copy(image.tobytes())
        bitmap = m.mtmd_bitmap_init(image.shape[1], image.shape[0], data)
        chunks = m.mtmd_input_chunks_init()
        marker = m.mtmd_default_marker()
        text = m.mtmd_input_text(marker, len(marker), False, True)
        bitmaps = (m.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert m.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
        chunk = next(
            c
            for i in range(m.mtmd_input_chunks_size(chunks))
            if m.mtmd_input_chunk_get_type(c := m.mtmd_input_chunks_get(chunks, i)) != 0
        )
        n = m.mtmd_input_chunk_get_n_tokens(chunk)
        assert n == last - first
        assert m.mtmd_encode_chunk(ctx, chunk) == 0
        embd = m.mtmd_get_output_embd(ctx)
        width = llama_cpp.llama_model_n_embd_inp(model)  # the model's with DeepStack's slices
        rows = np.ctypeslib.as_array(embd, shape=(n * width,)).reshape(n, width).copy()
        no_callback = m.mtmd_helper_post_decode_callback()
        assert (
            m.mtmd_helper_decode_image_chunk(
                ctx,
                lctx,
                chunk,
                embd,
                n_past.value,
                0,
                128,
                ctypes.byref(n_past),
                no_callback,
                None,
            )
            == 0
        )
        decode(ids[last:])
        vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        logits = llama_cpp.llama_get_logits_ith(lctx, -1)
        out = np.ctypeslib.as_array(logits, shape=(vocab,)).copy()
        llama_cpp.llama_batch_free(batch)
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
        return rows, out
    finally:
        m.mtmd_free(ctx)
        llama_cpp.llama_free(lctx)
        llama_cpp.llama_model_free(model)


def test_llama_cpp_sees_the_image_as_transformers_after_vision_training(exported, tmp_path):
    """mtmd's image rows are transformers' image features of the hf export (the merger's,
    then each DeepStack merger's), and the last logits after a chat prompt with the image are
    its logits within llama.cpp's arithmetic (tests/integration/test_llamacpp.py's)."""
    from PIL import Image

    pytest.importorskip("llama_cpp.mtmd_cpp")
    kind, _, processor, tok, hf_folder, out = exported
    path = save_image(tmp_path / "pic.png", "png", (SIDE, SIDE), 1)
    image = np.asarray(Image.open(path).convert("RGB"))
    user = [{"type": "image", "image": str(path)}, {"type": "text", "text": "What colour?"}]
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )
    inputs = qwen_inputs(processor, tok, prompt, [Image.open(path).convert("RGB")])
    assert inputs["image_grid_thw"].tolist() == [[1, SIDE // 8, SIDE // 8]]  # not resized
    merged = qwen_reloaded(hf_folder)
    with torch.no_grad():
        feats = merged.model.get_image_features(
            pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"]
        )
        deep = [
            d[0] if isinstance(d, list | tuple) else d
            for d in getattr(feats, "deepstack_features", None) or []
        ]
        want = torch.cat([feats.pooler_output[0], *deep], -1)
        logits = merged(**inputs).logits[0, -1].numpy()
    ids = inputs["input_ids"][0].tolist()
    token = tok.convert_tokens_to_ids("<|image_pad|>")
    rows, theirs = mtmd_run(out / "model.gguf", out / mmproj.NAME, image, ids, token)
    print(f"{kind}: mtmd rows against transformers {np.abs(rows - want.numpy()).max():.4f}")
    assert rows.shape == tuple(want.shape) and np.abs(rows - want.numpy()).max() < 0.05
    theirs = theirs[: len(logits)]
    print(f"{kind}: last logits against transformers {np.abs(theirs - logits).max():.4f}")
    assert np.abs(theirs - logits).max() < 0.05 * max(1.0, np.abs(logits).std())
    assert int(theirs.argmax()) == int(logits.argmax())
