"""GGUF exports proven in llama.cpp itself (llama-cpp-python): the same token ids, logits
within llama.cpp's arithmetic, the same greedy continuation. llama-cpp-python builds from
source (about 20 minutes on 2 cores), so these tests run where it is installed and skip
elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import tiny_config

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")

from hf_models import FAMILIES, TEXT, make_model  # noqa: E402

from core.training.trainer import Trainer  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.generate import generate_ids, prompt_ids  # noqa: E402
from core.weights.loader import load  # noqa: E402


def llama_cpp_agrees(target, out, prompt: str, n_new: int = 12):
    loaded = load(target)
    export(target, "gguf", out, quant="f32")
    ids = prompt_ids(loaded.tokenizer, prompt)
    llm = llama_cpp.Llama(
        str(out / "model.gguf"), n_ctx=loaded.model.config.seq_len, logits_all=True,
        n_threads=1, verbose=False,
    )  # fmt: skip
    assert llm.tokenize(prompt.encode(), add_bos=True, special=False) == ids
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)])
    with torch.no_grad():
        ours = loaded.model(torch.tensor([ids]))[0][0].numpy()
    # llama.cpp computes attention with its own kernels: close, not bit-equal
    assert np.abs(theirs - ours).max() < 0.05 * max(1.0, np.abs(ours).std())
    expected = list(generate_ids(loaded.model, ids, n_new, temperature=0))
    got = []
    for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        got.append(token)
        if len(got) == n_new:
            break
    assert got == expected
    return llm


NEW_MODELS = {  # llama.cpp architecture: (arch, extra settings)
    "gpt2": ("gpt2", {}),
    "llama": ("llama", {"n_heads": 4, "n_kv_heads": 2}),
    "qwen3": ("llama", {"n_heads": 4, "n_kv_heads": 2, "qk_norm": True}),
}


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
@pytest.mark.parametrize("family", list(NEW_MODELS))
def test_new_model_gguf_runs_in_llama_cpp(tmp_path, family, tokenizer):
    arch, extra = NEW_MODELS[family]
    data = tmp_path / "code.txt"
    data.write_text(TEXT * 20, encoding="utf-8")
    cfg = tiny_config(
        data=str(data), arch=arch, tokenizer=tokenizer, vocab_size=512, max_steps=20,
        seq_len=48, dropout=0.0, sample_tokens=0, **extra,
    )  # fmt: skip
    Trainer(cfg, tmp_path / "run").run()
    llm = llama_cpp_agrees(tmp_path / "run", tmp_path / "gguf", "def add(a")
    assert llm.metadata["general.architecture"] == family


@pytest.mark.parametrize("family", FAMILIES)
def test_pretrained_family_gguf_runs_in_llama_cpp(tmp_path, family):
    make_model(tmp_path / "model", family)
    llm = llama_cpp_agrees(tmp_path / "model", tmp_path / "gguf", "def add(a, b): hello world")
    if family != "gpt2":  # the chat template travels in the file's metadata
        assert llm.metadata.get("tokenizer.chat_template")
