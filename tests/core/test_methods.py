"""The method declarations (core.config.methods) are whole: each one's fields reach the config,
its CLI flags and its checks, its runtime is the objective that trains it, and what the window
draws for it is its own."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from core.cli.train import build_parser
from core.config import methods
from core.config.methods.base import PAIRS, PROMPTS, WINDOWS
from core.config.spec import SPECS, TrainConfig, validate
from core.errors import ConfigError


def own_fields(method) -> list[str]:
    return [f.name for f in dataclasses.fields(method.fields)] if method.fields else []


def test_each_methods_fields_are_config_fields_with_flags_and_no_two_share_one():
    flags = build_parser().format_help()
    seen = []
    for method in methods.METHODS.values():
        for name in own_fields(method):
            assert name in SPECS
            assert "--" + name.replace("_", "-") in flags
        seen += own_fields(method)
    assert len(seen) == len(set(seen)) == 16  # dpo's 2, grpo's 14 (reward_timeout): none lost


def test_the_method_field_offers_the_registry_with_each_methods_help():
    spec = SPECS["method"]
    assert spec.choices == methods.NAMES == ("sft", "dpo", "grpo")
    assert TrainConfig().method == methods.DEFAULT == "sft"
    assert spec.help == (  # the --help text from before the methods declared themselves
        "sft: learn the data's text or answers; dpo: preference tuning (Direct Preference "
        "Optimization) on pairs of a chosen and a rejected answer, from a pretrained model or "
        "a finished run (init_from); grpo: reinforcement learning with rewards on sampled "
        "completions of prompts (GRPO, docs/grpo.md)"
    )


@pytest.mark.parametrize("name", ["sft", "dpo", "grpo"])
def test_a_declarations_runtime_is_the_objective_of_that_name(name):
    from core.training.objectives import Objective

    module, cls = methods.get(name).runtime.split(":")
    objective = getattr(importlib.import_module(module), cls)
    assert issubclass(objective, Objective) and objective.name == name


def test_data_kinds_and_rows_per_example():
    cfg = TrainConfig(batch_size=2, grad_accum=3, seq_len=16, num_generations=4)
    rows = {}
    for name in methods.NAMES:
        c = dataclasses.replace(cfg, method=name)
        rows[name] = c.tokens_per_step // (2 * 3 * 16)
    assert rows == {"sft": 1, "dpo": 2, "grpo": 4}
    assert methods.taking(WINDOWS).name == "sft"
    assert methods.taking(PAIRS).name == "dpo"
    assert methods.taking(PROMPTS).name == "grpo"


def test_a_methods_checks_run_only_when_it_is_chosen():
    with pytest.raises(ConfigError, match="reward: method grpo needs at least one reward") as e:
        validate(TrainConfig(method="grpo", init_from="x", tokenizer="model"))
    assert e.value.field == "reward"
    validate(TrainConfig(reward=[]))  # sft: GRPO's checks do not run
    tidied = validate(TrainConfig(reward=" answer ", reward_regex="  "))  # but its tidying does
    assert tidied.reward == ["answer"] and tidied.reward_regex is None


def test_each_methods_curves_are_drawn_in_its_own_plot():
    for method in methods.METHODS.values():
        if method.plot is None:
            assert not method.curves
            continue
        keys = {c.key for c in method.curves}
        assert {c.plot for c in method.curves} == {method.plot.name}
        assert set(method.plot.shown_by) <= keys
        if method.measure is not None:
            assert {method.measure.train_key, method.measure.eval_key} <= keys


def test_a_methods_repeatable_fields_repeat_on_the_command_line():
    args = build_parser().parse_args(
        ["--reward", "answer", "--reward", "length", "--data", "a.txt", "--data", "b.txt"]
    )
    assert args.reward == ["answer", "length"] and args.data == ["a.txt", "b.txt"]
    assert build_parser().parse_args(["--dpo-beta", "0.2"]).dpo_beta == 0.2
