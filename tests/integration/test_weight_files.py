"""A damaged or mismatched model folder is refused in one line, exit 2, before any data is
prepared: a cut-short safetensors file, a tensor whose shape or dtype contradicts config.json,
an index naming a missing shard or a tensor its shard lacks."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from hf_models import TEXT, make_model  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from core.cli.train import main as train_main  # noqa: E402


@pytest.fixture
def model(tmp_path):
    make_model(tmp_path / "model", "llama")
    return tmp_path / "model"


def train(tmp_path, model, capsys) -> tuple[int, str]:
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    capsys.readouterr()
    args = [
        "--init-from",
        str(model),
        "--data",
        str(data),
        "--max-steps",
        "2",
        "--out",
        str(tmp_path / "run"),
        "--data-cache",
        str(tmp_path / "cache"),
    ]
    code = train_main(args)
    err = capsys.readouterr().err.strip()
    assert not (tmp_path / "run").exists()  # nothing started
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    assert len(err.splitlines()) == 1, err
    return code, err


def test_a_cut_short_file_is_named(tmp_path, model, capsys):
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, err = train(tmp_path, model, capsys)
    assert code == 2 and "model.safetensors is cut short: tensor" in err


def test_a_file_shorter_than_its_header(tmp_path, model, capsys):
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, err = train(tmp_path, model, capsys)
    assert code == 2 and "shorter than its own header" in err


def test_a_tensor_whose_shape_contradicts_the_config(tmp_path, model, capsys):
    path = model / "model.safetensors"
    state = load_file(str(path))
    name = "model.layers.1.mlp.down_proj.weight"
    state[name] = state[name][:, :-1].contiguous()
    save_file(state, str(path), {"format": "pt"})
    code, err = train(tmp_path, model, capsys)
    assert code == 2 and name in err and "config.json gives" in err


def test_a_tensor_that_is_not_a_float(tmp_path, model, capsys):
    path = model / "model.safetensors"
    state = load_file(str(path))
    name = "model.norm.weight"
    state[name] = state[name].long()
    save_file(state, str(path), {"format": "pt"})
    code, err = train(tmp_path, model, capsys)
    assert code == 2 and f"{name} is I64, not a float type" in err


def test_an_index_naming_a_missing_shard(tmp_path, model, capsys):
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    state = load_file(str(model / "model-00001-of-00002.safetensors"))
    weight_map = {name: "model-00001-of-00002.safetensors" for name in state}
    weight_map["model.norm.weight"] = "model-00002-of-00002.safetensors"
    index = {"metadata": {}, "weight_map": weight_map}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    code, err = train(tmp_path, model, capsys)
    assert code == 2 and "lacks the shard model-00002-of-00002.safetensors" in err


def test_an_index_naming_a_tensor_its_shard_lacks(tmp_path, model, capsys):
    (model / "model.safetensors").rename(model / "model-00001-of-00001.safetensors")
    state = load_file(str(model / "model-00001-of-00001.safetensors"))
    weight_map = {name: "model-00001-of-00001.safetensors" for name in state}
    weight_map["model.extra.weight"] = "model-00001-of-00001.safetensors"
    index = {"metadata": {}, "weight_map": weight_map}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    code, err = train(tmp_path, model, capsys)
    assert code == 2 and "lacks tensor model.extra.weight" in err
