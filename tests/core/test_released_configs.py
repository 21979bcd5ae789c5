"""Released config.json files hold only what differs from their transformers class's defaults
(Qwen3.5-MoE's have no intermediate_size at all, Gemma 3's text_config leaves most out). Each
family keeps its class's defaults as data (Family.defaults) and reads such a file as
transformers fills it in; these tests keep the data equal to transformers' classes, and read
each family's tiny config (composites too) written both ways. The tiny models of
tests/hf_models.py are saved in the released form, so every test that loads one (logits
against transformers in test_pretrained, test_moe_families, test_composites, ...) reads it."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from hf_models import (  # noqa: E402
    COMPOSITE_CONFIGS,
    FAMILIES,
    GEMMA4_CONFIGS,
    MOE_FAMILIES,
    make_config,
    released_config,
)

from core.weights import families  # noqa: E402
from core.weights.families.base import with_defaults  # noqa: E402

# Each family's transformers config class (its text model's, for a composite)
CLASSES = {
    "gpt2": "GPT2Config",
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "gemma2": "Gemma2Config",
    "gemma3": "Gemma3TextConfig",
    "gemma4": "Gemma4TextConfig",
    "phi3": "Phi3Config",
    "smollm3": "SmolLM3Config",
    "qwen3_moe": "Qwen3MoeConfig",
    "qwen2_moe": "Qwen2MoeConfig",
    "mixtral": "MixtralConfig",
    "olmoe": "OlmoeConfig",
    "gpt_oss": "GptOssConfig",
    "qwen3_5": "Qwen3_5TextConfig",
    "qwen3_5_moe": "Qwen3_5MoeTextConfig",
    "qwen3_vl": "Qwen3VLTextConfig",
}
# A class's defaults that set nothing of the model TrainDeck builds: training switches
# (dropout, caching, init), token ids (the tokenizer's files give those) and other heads'.
NOT_THE_MODEL = {
    "output_hidden_states",
    "return_dict",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "initializer_range",
    "use_cache",
    "attention_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "summary_type",
    "summary_use_proj",
    "summary_proj_to_labels",
    "summary_first_dropout",
    "add_cross_attention",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "pretraining_tp",
    "router_jitter_noise",
}
# Every family's tiny model of tests/hf_models.py (Gemma 4's dense and MoE forms)
TINY = [*FAMILIES, *MOE_FAMILIES, "qwen3_5", "gpt_oss", *GEMMA4_CONFIGS]


def config_class(family: str):
    return getattr(transformers, CLASSES[family])


def shape(hf: dict):
    return families.model_config(hf, "config.json")


def test_every_family_names_its_class():
    assert set(CLASSES) == set(families.FAMILIES)


@pytest.mark.parametrize("family", CLASSES)
def test_a_familys_defaults_are_its_transformers_classs(family):
    """Its documented defaults (the dataclass fields'), and the RoPE settings the class
    fills in when a file states none: equal, both ways, so neither can drift."""
    cls = config_class(family)
    want = {k: v for k, v in cls.default_config_fields().items() if k not in NOT_THE_MODEL}
    rope = cls().to_dict().get("rope_parameters")
    if rope:
        want["rope_parameters"] = rope
    assert families.get(family).defaults == want


@pytest.mark.parametrize("family", CLASSES)
def test_a_familys_aliases_are_its_classs_and_read_under_its_name(family):
    """Another name a config.json may give a setting (a class's attribute_map: GPT-2's
    hidden_size is its n_embd, Qwen3-MoE's num_local_experts its num_experts): the same
    pairs, read under the name the family's defaults use, never overridden by a default."""
    cls, f = config_class(family), families.get(family)
    assert {frozenset(p) for p in f.aliases.items()} == {
        frozenset(p) for p in cls.attribute_map.items()
    }
    for alias, name in f.aliases.items():
        assert name in f.defaults
        full = cls().to_dict()
        stated = {k: v for k, v in full.items() if k not in (alias, name)}
        value = full.get(name, full.get(alias))
        changed = {**stated, alias: value + 1}  # a count or a width: one more
        assert shape(changed) == shape({**stated, name: value + 1}), alias


@pytest.mark.parametrize("family", CLASSES)
def test_a_config_of_its_model_type_alone_reads_as_the_class_fills_it_in(family):
    cls = config_class(family)
    bare = {"model_type": cls.model_type}
    assert shape(bare) == shape(cls().to_dict())


@pytest.mark.parametrize("family", TINY)
def test_a_tiny_config_written_as_released_reads_as_written_in_full(family):
    """What differs from the defaults only (as hf_models saves every tiny model) and every
    key (transformers 5's save_pretrained): the same model."""
    config = make_config(family, 600, eos_token_id=3)
    released = released_config(config)
    full = config.to_dict()
    assert len(released) < len(full)  # some keys are left out
    assert shape(released) == shape(full)


@pytest.mark.parametrize("family", COMPOSITE_CONFIGS)
def test_a_composite_written_as_released_reads_as_written_in_full(family):
    config = COMPOSITE_CONFIGS[family](600, 3)
    released = released_config(config)
    full = config.to_dict()
    assert len(released["text_config"]) < len(full["text_config"])
    assert shape(released) == shape(full)
    assert shape(released)[0] == family


def test_qwen3_5_moe_reads_a_config_without_intermediate_size():
    """Its class has none, and Qwen3.5-35B-A3B's config.json neither: its experts' and
    shared expert's widths are all it holds (every layer holds experts)."""
    assert not hasattr(config_class("qwen3_5_moe")(), "intermediate_size")
    for config in (
        make_config("qwen3_5_moe", 600),
        COMPOSITE_CONFIGS["qwen3_5_moe"](600, 3).text_config,
    ):
        hf = released_config(config)
        assert "intermediate_size" not in hf
        family, c = shape(hf)
        assert family == "qwen3_5_moe"
        assert (c.moe["expert_dim"], c.moe["shared_expert_dim"]) == (16, 24)
        assert c.moe["sparse_layers"] == [0, 1, 2, 3]


def test_a_files_own_rope_settings_stay_whole():
    """The default's RoPE settings apply to a file that states none; one that states its own
    (the older rope_theta/rope_scaling, or rope_parameters) keeps them, taking from the
    default only the base and the rotary fraction it does not state."""
    qwen = families.get("qwen3_5").defaults
    assert with_defaults({}, qwen)["rope_parameters"]["partial_rotary_factor"] == 0.25
    own = with_defaults({"rope_theta": 1e7}, qwen)
    assert "rope_parameters" not in own and own["partial_rotary_factor"] == 0.25
    assert own["rope_theta"] == 1e7
    stated = with_defaults({"rope_parameters": {"rope_type": "default"}}, qwen)
    assert stated["rope_theta"] == 1e4 and stated["rope_parameters"] == {"rope_type": "default"}
    scaled = {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    filled = with_defaults(scaled, families.get("mixtral").defaults)
    assert "rope_parameters" not in filled and filled["rope_theta"] == 1e6
    assert shape({"model_type": "mixtral", **scaled})[1].rope_theta == 1e6  # Mixtral's base
    gemma3 = {"model_type": "gemma3_text", "rope_scaling": {"rope_type": "linear", "factor": 8}}
    c = shape(gemma3)[1]  # Gemma 3 4B's text_config: linear x8 on the global layers' 1e6
    assert (c.rope_theta, c.rope_local_theta, c.rope_scaling["factor"]) == (1e6, 1e4, 8)
