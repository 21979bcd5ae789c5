"""Pretrained starts: tiny random models of each family, built and saved by transformers,
must load with equal logits and greedy text, fine-tune, and export back to transformers."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from hf_models import FAMILIES, TEXT, make_model  # noqa: E402

ALL = (*FAMILIES, "qwen3_5")  # Qwen3.5-MoE: test_moe_families

from core.cli.generate import main as generate_main  # noqa: E402
from core.cli.train import main as train_main  # noqa: E402
from core.data.chat import chat_ids  # noqa: E402
from core.use.export import export  # noqa: E402
from core.use.generate import generate_ids  # noqa: E402
from core.weights.loader import load  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> (folder, transformers model, transformers tokenizer)"""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for family in ALL:
        model, tok = make_model(root / family, family)
        out[family] = (root / family, model, tok)
    return out


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "notes.txt"
    path.write_text(TEXT * 6, encoding="utf-8")
    return path


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    model.generation_config.eos_token_id = None  # n tokens, whatever they are
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("family", ALL)
def test_logits_and_greedy_text_equal_transformers(models, family):
    folder, hf_model, tok = models[family]
    loaded = load(folder)
    assert loaded.family == family and loaded.config is None
    ids = tok("def add(a, b): hello world 12")["input_ids"]
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits
    ours = loaded.model.logits(torch.tensor([ids]))
    assert (ref - ours).abs().max().item() < 1e-4
    expected = hf_greedy(hf_model, ids, 12)
    for cache in (True, False):  # the KV-cache path agrees with the full forward
        got = list(generate_ids(loaded.model, ids, 12, temperature=0, use_cache=cache))
        assert got == expected


def fine_tune(folder, out, data, *extra):
    args = [
        "--init-from",
        str(folder),
        "--data",
        str(data),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--max-steps",
        "12",
        "--eval-every",
        "6",
        "--ckpt-every",
        "6",
        "--batch-size",
        "4",
        "--grad-accum",
        "1",
        "--seq-len",
        "32",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "2",
        "--eval-batches",
        "2",
        "--sample-tokens",
        "4",
        "--precision",
        "fp32",
        *extra,
    ]
    return train_main(args)


def val_losses(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r["val_loss"] for r in map(json.loads, lines) if "val_loss" in r]


@pytest.mark.parametrize("family", ALL)
def test_fine_tune_lowers_val_loss_and_hf_export_matches(models, data_file, tmp_path, family):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, _, tok = models[family]
    run = tmp_path / "run"
    assert fine_tune(folder, run, data_file) == 0
    losses = val_losses(run)
    assert len(losses) == 3 and losses[-1] < losses[0]  # step 0 is the base model's loss
    state = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert state["base"]["family"] == family and len(state["base"]["fingerprint"]) == 24

    export(run, "hf", tmp_path / "hf", which="latest")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert (
        type(exported).__name__
        == json.loads((folder / "config.json").read_text())["architectures"][0]
    )
    assert (
        AutoTokenizer.from_pretrained(tmp_path / "hf")("hello world")["input_ids"]
        == tok("hello world")["input_ids"]
    )
    ours = load(run, which="latest")
    ids = torch.tensor([tok("def add(a, b): return a")["input_ids"]])
    with torch.no_grad():
        diff = (exported(ids).logits - ours.model.logits(ids)).abs().max().item()
    assert diff < 1e-4


def test_documents_are_separated_by_the_models_eos_and_bos(models, tmp_path):
    from core.data.prepare import DataSpec, prepare
    from core.data.sources import find_sources

    folder, _, tok = models["llama"]  # its tokenizer adds BOS
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("hello world\n" * 40)
    (docs / "b.txt").write_text("def add(a, b):\n" * 40)
    pre = load(folder).tokenizer
    sources = find_sources(str(docs), [".txt"], 10**6)
    entry, manifest = prepare(
        DataSpec(sources, "model", 0, 0.1), tmp_path / "cache", pre, log=lambda m: None
    )
    ids = torch.from_numpy(
        __import__("numpy").fromfile(entry / "tokens.bin", dtype=manifest["dtype"]).astype("int64")
    ).tolist()
    assert ids[0] == tok.bos_token_id
    assert ids.count(tok.bos_token_id) == 2 and ids.count(tok.eos_token_id) == 2
    first_doc = ids[1 : ids.index(tok.eos_token_id)]
    assert first_doc == tok("hello world\n" * 40, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_chat_matches_transformers_template_and_generate(models, family, capsys):
    folder, hf_model, tok = models[family]
    loaded = load(folder)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    expected_prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(expected_prompt, dict) or hasattr(expected_prompt, "keys"):
        expected_prompt = expected_prompt["input_ids"]
    prompt = chat_ids(loaded.tokenizer, messages)
    assert prompt == list(expected_prompt)
    stops = loaded.tokenizer.stop_ids
    hf_model.generation_config.eos_token_id = stops
    out = hf_model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=10)
    expected = out[0, len(prompt) :].tolist()
    got = list(generate_ids(loaded.model, prompt, 10, temperature=0, stop_ids=stops))
    assert got == expected

    argv = [str(folder), "--chat", "--system", "Be brief.", "--prompt", "hi", "--temperature", "0"]
    assert generate_main([*argv, "--max-new-tokens", "10"]) == 0
    shown = [i for i in got if i not in stops]
    assert capsys.readouterr().out == tok.decode(shown) + "\n"


# -- bad input: one line, exit 2, nothing written -----------------------------------------


def _bad_folder(tmp_path, models, config_change):
    folder = tmp_path / "model"
    shutil.copytree(models["llama"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(config_change)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "case, needle",
    [
        ("missing", "does not exist"),
        ("no_config", "has no config.json"),
        ("unsupported", "model_type 'bert' is not supported; supported: gpt2, llama"),
        ("remote_code", "never runs code"),
        ("hub_offline", "cannot be reached (offline); connect once"),
        ("shape", "hidden_dim: 64 contradicts the pretrained model"),
        ("seq_len", "seq_len: 128 is longer than the pretrained model's context (64)"),
        ("lora_experts", "is a dense model (no experts); it applies to mixture-of-experts"),
        ("train_router", "is a dense model (no experts); it applies to mixture-of-experts"),
    ],
)
def test_bad_pretrained_input_is_one_line_exit_2(
    models, data_file, tmp_path, monkeypatch, capsys, case, needle
):
    target, extra = str(models["llama"][0]), []
    if case == "missing":
        target = str(tmp_path / "nowhere")
    elif case == "no_config":
        (tmp_path / "empty").mkdir()
        target = str(tmp_path / "empty")
    elif case == "unsupported":
        target = str(_bad_folder(tmp_path, models, {"model_type": "bert"}))
    elif case == "remote_code":
        target = str(_bad_folder(tmp_path, models, {"auto_map": {"AutoModel": "x.Model"}}))
    elif case == "hub_offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
        target = "nobody/not-cached-model"
    elif case == "shape":
        extra = ["--hidden-dim", "64"]
    elif case in ("lora_experts", "train_router"):
        extra = ["--lora-rank", "4", "--" + case.replace("_", "-")]
    else:
        extra = ["--seq-len", "128"]
    out = tmp_path / "run"
    args = ["--init-from", target, "--data", str(data_file), "--out", str(out), "--max-steps", "2"]
    assert train_main([*args, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and needle in err, err
    assert case not in ("lora_experts", "train_router") or err.startswith(f"error: {case}: ")
    assert not out.exists()


def test_resume_refuses_another_base_model(models, data_file, tmp_path, capsys):
    base = tmp_path / "base"
    shutil.copytree(models["qwen2"][0], base)
    run = tmp_path / "run"
    assert fine_tune(base, run, data_file, "--max-steps", "6") == 0
    make_model(tmp_path / "other", "qwen2", seed=1)  # same shape, other weights
    shutil.copy(tmp_path / "other" / "model.safetensors", base / "model.safetensors")
    before = (run / "checkpoints" / "latest.pt").read_bytes()
    capsys.readouterr()
    assert train_main(["--resume", str(run), "--max-steps", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "was fine-tuned from" in err and "other weights" in err
    assert (run / "checkpoints" / "latest.pt").read_bytes() == before


def test_a_pickled_only_folder_loads_plain_weights_and_refuses_code(models, tmp_path):
    from safetensors.torch import load_file

    folder = tmp_path / "bin-only"
    shutil.copytree(models["gpt2"][0], folder)
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")  # plain tensors: weights_only reads them
    ids = torch.tensor([[5, 6, 7, 8]])
    expected = load(models["gpt2"][0]).model.logits(ids)
    assert torch.equal(load(folder).model.logits(ids), expected)

    class Payload:  # a pickle that would need code to load
        def __reduce__(self):
            return (print, ("this must never run",))

    torch.save({"x": Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(Exception, match="cannot be read as plain weights"):
        load(folder)


def file_mappings(path) -> dict[str, int]:
    """Resident KiB of each of this process's mappings of path, by address range (Linux's
    /proc/self/smaps)."""
    out, current = {}, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            current = fields[0] if len(fields) > 5 and fields[5] == str(path) else None
        elif current and fields[0] == "Rss:":
            out[current] = out.get(current, 0) + int(fields[1])
    return out


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's /proc only")
def test_loading_keeps_no_file_pages_the_model_does_not_use(models):
    """Joining q/k/v reads their file pages; they are let go after loading (they counted in
    the process's memory for the whole run), and the weights still read their files."""
    from core.weights.loader import open_pretrained

    folder, hf_model, tok = models["qwen3"]
    weights = (folder / "model.safetensors").resolve()
    gc.collect()
    before = set(file_mappings(weights))  # earlier tests' maps not yet collected
    model = open_pretrained(folder).load_model()
    ours = {k: v for k, v in file_mappings(weights).items() if k not in before}
    assert ours and sum(ours.values()) == 0
    ids = torch.tensor([tok("def add(a, b): hello")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model.logits(ids), hf_model(ids).logits, atol=1e-4)
