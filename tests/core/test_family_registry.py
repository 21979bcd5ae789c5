"""Model families are modules listed by one registry (core/weights/families): nothing else in
core/ or gui/ compares family names or keys a table by them, so adding a family is its module
and its tests."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core.weights import families

ROOT = Path(__file__).resolve().parents[2]
NAMES = set(families.FAMILIES) | {t for f in families.FAMILIES.values() for t in f.model_types}


def sources():
    for folder in ("core", "gui"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "families" not in path.relative_to(ROOT).parts:
                yield path


def test_no_file_outside_the_family_modules_compares_family_names():
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            text = ast.unparse(node) if isinstance(node, ast.Compare | ast.Dict) else ""
            if isinstance(node, ast.Compare) and "arch" in text:
                continue  # a new model's arch (gpt2 / llama)
            literals = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)}
            if isinstance(node, ast.Compare) and literals & NAMES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
            if isinstance(node, ast.Dict) and len(literals & NAMES) >= 2:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: a table by family")
    assert not found, "\n".join(found)


def test_every_model_type_reads_as_one_family_and_others_are_named():
    seen = [t for f in families.FAMILIES.values() for t in (f.name, *f.model_types)]
    assert len(seen) == len(set(seen))
    assert families.family_of({"model_type": "gemma3_text"}) == "gemma3"
    with pytest.raises(families.UnsupportedModel) as e:
        families.family_of({"model_type": "falcon"}, "x/config.json")
    assert "x/config.json: model_type 'falcon' is not supported" in str(e.value)
    assert "gemma2" in str(e.value) and "phi3" in str(e.value)


def test_a_composite_reads_as_its_language_models_family_or_is_refused_naming_its_class():
    towers = {"vision_config": {"hidden_size": 8}, "audio_config": {"hidden_size": 8}}
    gemma = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}, **towers}
    assert families.family_of(gemma) == "gemma3"
    assert families.family_of({**gemma, "text_config": {}}) == "gemma3"  # the composite's
    other = {
        "architectures": ["FooForConditionalGeneration"],
        "model_type": "foo",
        "text_config": {"model_type": "foo_text"},
        "vision_config": {},
    }
    with pytest.raises(families.UnsupportedModel) as e:
        families.family_of(other, "x/config.json")
    assert str(e.value).startswith("x/config.json: FooForConditionalGeneration is not supported")
    assert "'foo_text'" in str(e.value)


def test_the_family_list_is_the_registrys():
    """The families are listed from the registry (families.display_list(), as the window's
    Start from dialog shows them); the --init-from help names none, so it cannot fall behind
    a new family."""
    from core.config.spec import SPECS

    help_text = SPECS["init_from"].help
    assert not [f.display for f in families.FAMILIES.values() if f.display in help_text]
