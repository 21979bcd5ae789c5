"""Caches written before core/data/prepare.py was split into one builder per data kind are
still hit: the same cache keys, and their entries accepted as they are
(tests/fixtures/before_split, written by the code before the split: see its make.py)."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from core.data.prepare import ChatSpec, DataSpec, prepare
from core.data.sources import find_sources

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "before_split"


def _make_module():
    spec = importlib.util.spec_from_file_location("before_split_make", FIXTURE / "make.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cache_keys_are_the_ones_the_code_before_the_split_made():
    make = _make_module()
    saved = json.loads((FIXTURE / "keys.json").read_text())
    for name, values in make.SPECS.items():
        template = "T" if values.get("chat") else None
        assert make.spec_of(values).key(saved["listing"], template) == saved["keys"][name], name


def _sources(tmp_path: Path, kind: str) -> DataSpec:
    """The same source the fixture's entry was prepared from (make.py writes it alike)."""
    if kind == "text":
        path = tmp_path / "a.txt"
        path.write_text("def add(a, b):\n    return a + b\n" * 40)
        return DataSpec(find_sources(str(path), [".txt"], 0), "bytes", 256, 0.1)
    path = tmp_path / "c.jsonl"
    turn = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello there"},
        ]
    }
    path.write_text((json.dumps(turn) + "\n") * 40)
    return DataSpec(find_sources(str(path), [], 0, chat=True), "bytes", 256, 0.1, ChatSpec(64))


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_an_entry_written_before_the_split_is_hit_and_built_alike(tmp_path, kind):
    spec, cache = _sources(tmp_path, kind), tmp_path / "cache"
    folder, fresh = prepare(spec, cache, log=lambda line: None)
    old = FIXTURE / kind
    for name in ("tokens.bin", "mask.bin"):  # the split builders write the same bytes
        if (old / name).exists():
            assert (folder / name).read_bytes() == (old / name).read_bytes(), name
    shutil.rmtree(folder)
    shutil.copytree(old, folder)  # the entry the old code wrote, under today's key
    again, manifest = prepare(spec, cache, log=lambda line: None)
    assert again == folder
    assert manifest == json.loads((old / "manifest.json").read_text())  # hit, not rebuilt
    assert manifest["fingerprint"] == fresh["fingerprint"]
