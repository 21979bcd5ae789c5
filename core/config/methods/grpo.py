"""GRPO's declaration: its rewards and sampling settings (a form box of their own), their
checks, prompts as data, G completions a prompt, and its rewards plot, the reward Compare draws
and the best held-out reward the resume dialog shows (TRL's names). Its runtime:
core/training/grpo.py (rewards: core/training/rewards.py)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from core.config.declare import spec
from core.config.methods.base import PROMPTS, Best, Curve, Measure, Method, Plot
from core.errors import ConfigError

NAME = "grpo"
GRPO = "GRPO: rewards and sampling"  # the form's box for this method's fields
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")  # TRL's names; dapo: TRL's default
SCALE_REWARDS = ("group", "batch", "none")
BUILTIN_REWARDS = ("answer", "regex", "think_format", "length")  # core.training.rewards


@dataclass
class GRPOFields:
    """GRPO's rewards and sampling."""

    reward: list[str] = spec(
        [],
        "grpo: a reward function, repeatable: a built-in (answer, regex, think_format, "
        "length) or path.py:function (your own code, called as TRL calls it); the form: "
        "comma-separated",
        label="Rewards",
        group=GRPO,
        widget="text",
        placeholder="answer, think_format, C:/path/rewards.py:my_reward",
        repeat=True,
    )
    reward_weights: str | None = spec(
        None,
        "grpo: one weight per reward, comma-separated (default: 1 each)",
        label="Reward weights",
        group=GRPO,
        optional=True,
        placeholder="1 each",
        widget="text",
    )
    reward_regex: str | None = spec(
        None,
        "grpo: the pattern the regex reward looks for in a completion (Python re, DOTALL)",
        label="Reward regex",
        group=GRPO,
        optional=True,
        widget="text",
    )
    reward_length_target: int | None = spec(
        None,
        "grpo: the length reward's target in tokens (default: half of max_completion_tokens)",
        low=1,
        high=1_000_000,
        optional=True,
    )
    reward_timeout: float = spec(
        60.0,
        "grpo: the longest one call of a reward function may take, in seconds; past it the run "
        "ends naming the reward and the data rows (Stop does not wait for it)",
        label="Reward time limit (s)",
        group=GRPO,
        low=0.1,
        high=86_400.0,
    )
    num_generations: int = spec(
        8,
        "grpo: completions sampled per prompt (G); batch_size counts prompts",
        label="Completions per prompt",
        group=GRPO,
        low=2,
        high=1024,
        stream=True,
    )
    max_completion_tokens: int = spec(
        256,
        "grpo: the longest completion sampled, in tokens (it stops earlier at the end of turn)",
        label="Completion length",
        group=GRPO,
        low=1,
        high=1_000_000,
        stream=True,
    )
    temperature: float = spec(
        1.0,
        "grpo: the sampling temperature of completions (0: greedy, the likeliest token)",
        label="Temperature",
        group=GRPO,
        low=0.0,
        high=10.0,
        stream=True,
    )
    top_p: float = spec(
        1.0,
        "grpo: nucleus sampling of completions (1: off)",
        label="Top-p",
        group=GRPO,
        low=0.01,
        high=1.0,
        stream=True,
    )
    grpo_beta: float = spec(
        0.0,
        "grpo: the KL penalty to the reference model (0, as TRL: no reference pass)",
        label="GRPO beta (KL)",
        group=GRPO,
        low=0.0,
        high=100.0,
    )
    epsilon: float = spec(
        0.2,
        "grpo: the clipping range of the policy ratio",
        label="Clip epsilon",
        group=GRPO,
        low=0.0,
        high=10.0,
    )
    loss_type: str = spec(
        "dapo",
        "grpo: how the token losses are normalized (TRL's loss_type; dapo is TRL's default)",
        label="GRPO loss type",
        group=GRPO,
        choices=LOSS_TYPES,
    )
    scale_rewards: str = spec(
        "group",
        "grpo: divide advantages by the group's reward std, the batch's, or not at all "
        "(none: Dr. GRPO)",
        label="Scale rewards",
        group=GRPO,
        choices=SCALE_REWARDS,
    )
    mask_truncated_completions: bool = spec(
        False,
        "grpo: leave completions cut at max_completion_tokens out of the loss",
        label="Mask truncated completions",
        group=GRPO,
    )


def tidy(values: dict) -> None:
    """The reward list and the form's empty texts, for any method (they are saved)."""
    rewards = values["reward"]
    rewards = [] if rewards is None else [rewards] if isinstance(rewards, str) else rewards
    if not isinstance(rewards, list) or not all(isinstance(r, str) and r.strip() for r in rewards):
        raise ConfigError(
            f"reward: expected reward names or path.py:function, got {rewards!r}", field="reward"
        )
    values["reward"] = [r.strip() for r in rewards]
    for name in ("reward_weights", "reward_regex"):  # the form's empty fields: not set
        if values[name] is not None and not str(values[name]).strip():
            values[name] = None


def split_reward(spec: str) -> tuple[str, str] | None:
    """(file, function) of a reward written path.py:function; None for a built-in's name."""
    path, sep, function = spec.rpartition(":")
    if not sep or not path.lower().endswith(".py"):
        return None
    return path, function


def reward_weights(values) -> list[float]:
    """One weight per reward: the config's comma-separated list, or 1 each."""
    rewards, text = values["reward"], values["reward_weights"]
    if not text:
        return [1.0] * len(rewards)
    try:
        weights = [float(w) for w in str(text).split(",")]
    except ValueError:
        raise ConfigError(
            f"reward_weights: expected numbers separated by commas, got {text!r}",
            field="reward_weights",
        ) from None
    if len(weights) != len(rewards) or not all(math.isfinite(w) for w in weights):
        raise ConfigError(
            f"reward_weights: {len(weights)} weights for {len(rewards)} rewards; give one finite "
            "number per --reward, in the same order",
            field="reward_weights",
        )
    return weights


def check(values: dict) -> None:
    """The rewards' names and settings; the files themselves are read at the run's start
    (core.training.rewards), before the model loads."""
    if values["init_from"] is None:
        raise ConfigError(
            f"method: {NAME} tunes a model that can already write; give init_from (a pretrained "
            "model or a finished run)",
            field="method",
        )
    rewards = values["reward"]
    if not rewards:
        raise ConfigError(
            f"reward: method {NAME} needs at least one reward: a built-in "
            f"({', '.join(BUILTIN_REWARDS)}) or path.py:function",
            field="reward",
        )
    for name in rewards:
        if split_reward(name) is None and name not in BUILTIN_REWARDS:
            raise ConfigError(
                f"reward: unknown reward {name!r}; expected a built-in "
                f"({', '.join(BUILTIN_REWARDS)}) or path.py:function (a Python file)",
                field="reward",
            )
        if split_reward(name) is not None and not split_reward(name)[1].isidentifier():
            raise ConfigError(
                f"reward: {name!r} names no function after the colon (file.py:name)", field="reward"
            )
    if len(set(rewards)) != len(rewards):
        raise ConfigError(
            "reward: each reward once (give weights with --reward-weights)", field="reward"
        )
    weights = reward_weights(values)
    if values["reward_weights"]:
        values["reward_weights"] = ",".join(f"{w:g}" for w in weights)
    if "regex" in rewards:
        if not values["reward_regex"]:
            raise ConfigError(
                "reward: regex needs its pattern: --reward-regex PATTERN", field="reward"
            )
        try:
            re.compile(values["reward_regex"])
        except re.error as e:
            pattern = values["reward_regex"]
            raise ConfigError(
                f"reward_regex: {pattern!r} is not a pattern ({e})", field="reward_regex"
            ) from None
    if values["max_completion_tokens"] >= values["seq_len"]:
        raise ConfigError(
            f"max_completion_tokens: {values['max_completion_tokens']} leaves no room for the "
            f"prompt in seq_len {values['seq_len']}; lower it or raise seq_len",
            field="max_completion_tokens",
        )


def rows_per_example(cfg) -> int:
    return cfg.num_generations  # a prompt's G completions


PLOT = "rewards"
# the mean reward of the step's completions, its spread, the held-out reward, and how many
# completions were cut at the length limit
CURVES = (
    Curve("reward", PLOT, "reward", "#2ca02c", 1.5),
    Curve("reward_std", PLOT, "reward std", "#8c564b", 1.0),
    Curve(
        "eval_reward",
        PLOT,
        "held-out reward",
        "#0b3d91",
        2.0,
        symbol="o",
        antialias=True,
        evaluation=True,
    ),
    Curve(
        "frac_reward_zero_std",
        PLOT,
        "groups all alike (right axis)",
        "#7f7f7f",
        1.0,
        right_axis=True,
    ),
    Curve(
        "completions/clipped_ratio",
        PLOT,
        "cut at the length (right axis)",
        "#d62728",
        1.0,
        right_axis=True,
    ),
)

METHOD = Method(
    name=NAME,
    help="reinforcement learning with rewards on sampled completions of prompts (GRPO, "
    "docs/grpo.md)",
    runtime="core.training.grpo:GRPO",
    data=PROMPTS,
    fields=GRPOFields,
    form_group=GRPO,
    tidy=tidy,
    check=check,
    rows_per_example=rows_per_example,
    plot=Plot(PLOT, "Rewards (GRPO)", "reward", "share", ("reward", "eval_reward")),
    curves=CURVES,
    measure=Measure(
        "reward",
        "reward",
        "eval_reward",
        "reward: a GRPO run's training reward and held-out reward",
    ),
    best=Best("Best eval reward", "eval_reward", negated_val_loss=True),
    status=(("eval reward", "eval_reward"),),
    sampling_row="sampling (KV cache, G x B)",
)
