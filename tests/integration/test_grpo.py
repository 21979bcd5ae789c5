"""GRPO on a tiny random Qwen2-shaped model built with transformers' own config class: TRL's
advantages and losses on fixed numbers, batched KV-cache sampling against the plain forward,
a toy verifiable task learned, exact resume, the reference only when beta > 0, and rewards
that are refused with one line (exit 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers import StopAfter, plain_token_logps, tiny_config  # noqa: E402
from hf_models import make_model  # noqa: E402

from core.cli.train import main as train_main  # noqa: E402
from core.config.spec import validate  # noqa: E402
from core.errors import ConfigError  # noqa: E402
from core.models import lora  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from core.training import grpo, rewards  # noqa: E402
from core.training.inputs import build_model  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.weights.loader import apply_pretrained, open_pretrained  # noqa: E402

ARITHMETIC = Path(__file__).parent.parent / "fixtures" / "arithmetic.jsonl"
STARTS_WITH_A_NUMBER = r"^\s*\d"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo")
    make_model(root / "model", "qwen2")
    return root / "model"


def grpo_config(model_dir, **kw):
    values = dict(
        init_from=str(model_dir),
        tokenizer="model",
        data=str(ARITHMETIC),
        method="grpo",
        reward=["regex"],
        reward_regex=STARTS_WITH_A_NUMBER,
        num_generations=8,
        max_completion_tokens=6,
        seq_len=64,
        lr=1e-2,
        dropout=0.0,
        max_steps=25,
        batch_size=4,
        eval_every=100,
        ckpt_every=100,
        sample_tokens=0,
        log_every=1,
        warmup_steps=0,
    )
    values.update(kw)
    return tiny_config(**values)


# -- the formulas -------------------------------------------------------------------------------


def test_advantages_are_rewards_against_their_group_as_trl_computes_them():
    per_func = torch.tensor(
        [
            [1.0, 0.0],
            [0.0, 1.0],
            [1.0, 1.0],
            [0.0, 0.0],
            [1.0, math.nan],
            [1.0, math.nan],
            [0.0, 0.5],
            [1.0, 0.5],
        ]
    )
    weights = torch.tensor([1.0, 0.5])
    total = torch.tensor([1.0, 0.5, 1.5, 0.0, 1.0, 1.0, 0.25, 1.25])  # NaN counts as nothing
    adv, rewards, std, zero = grpo.advantages(per_func, weights, 4, "group")
    assert torch.allclose(rewards, total)
    for g in range(2):
        group = total[4 * g : 4 * g + 4]
        want = (group - group.mean()) / (group.std() + 1e-4)  # unbiased std, as torch.std
        assert torch.allclose(adv[4 * g : 4 * g + 4], want, atol=1e-6)
    adv_none, *_ = grpo.advantages(per_func, weights, 4, "none")
    assert torch.allclose(adv_none[:4], total[:4] - total[:4].mean())
    adv_batch, _, std_b, _ = grpo.advantages(per_func, weights, 4, "batch")
    assert torch.allclose(std_b, total.std().expand(8))
    assert torch.allclose(adv_batch[4:], (total[4:] - total[4:].mean()) / (total.std() + 1e-4))
    same = torch.ones(4, 1)
    adv_same, _, _, zero_same = grpo.advantages(same, torch.ones(1), 4, "group")
    assert zero_same.all() and (adv_same == 0).all()
    unscorable = torch.tensor([[math.nan], [1.0], [0.0], [1.0]])
    adv_u, rewards_u, *_ = grpo.advantages(unscorable, torch.ones(1), 4, "group")
    assert math.isnan(rewards_u[0]) and adv_u[0] == 0.0  # skipped, as TRL does
    assert torch.allclose(
        adv_u[1:], (torch.tensor([1.0, 0, 1]) - 2 / 3) / (0.57735 + 1e-4), atol=1e-4
    )


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_and_its_gradient_equal_the_hand_computation(loss_type, beta):
    torch.manual_seed(0)
    logits = torch.randn(4, 5, 11, requires_grad=True)
    targets = torch.randint(0, 11, (4, 5))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    adv = torch.tensor([1.0, -0.5, 0.25, -0.75])
    ref = torch.randn(4, 5) - 2.0
    cfg = validate(
        tiny_config(grpo_beta=beta, loss_type=loss_type, max_completion_tokens=5, grad_accum=2)
    )
    logps, entropy = plain_token_logps(logits, targets, temperature=0.7)
    loss, kl, ratio = grpo.policy_loss(logps, logps.detach(), ref, adv, mask, cfg, n_items=20.0)
    loss.backward()

    # By hand: log-softmax at temperature 0.7; one update per generation, so the ratio is 1
    # and the clipped term is -A; the k3 KL estimate; TRL's normalization of each loss type.
    lp = torch.log_softmax(logits.detach() / 0.7, -1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(logps.detach(), lp, atol=1e-6)
    assert torch.allclose(ratio, torch.ones_like(ratio))
    k3 = torch.exp(ref - lp) - (ref - lp) - 1
    per_token = -adv[:, None] + beta * k3
    m = mask.float()
    want = {
        "grpo": ((per_token * m).sum(1) / m.sum(1)).mean(),
        "bnpo": (per_token * m).sum() / m.sum(),
        "dr_grpo": (per_token * m).sum() / (4 * 5),
        "dapo": (per_token * m).sum() / 20.0 * 2,  # the trainer divides by grad_accum (2)
    }[loss_type]
    assert float(loss.detach()) == pytest.approx(float(want), rel=1e-5, abs=1e-6)
    # d loss / d logp = (-A + beta (1 - exp(ref - lp))) x the token's weight
    weight = {
        "grpo": m / m.sum(1, keepdim=True) / 4,
        "bnpo": m / m.sum(),
        "dr_grpo": m / 20,
        "dapo": m / 20 * 2,
    }[loss_type]
    dlogp = (-adv[:, None] + beta * (1 - torch.exp(ref - lp))) * weight
    probs = torch.softmax(logits.detach() / 0.7, -1)
    onehot = torch.nn.functional.one_hot(targets, 11).float()
    want_grad = dlogp[..., None] * (onehot - probs) / 0.7
    assert torch.allclose(logits.grad, want_grad, atol=1e-6)
    assert (kl is None) == (beta == 0.0)
    p = torch.softmax(logits.detach() / 0.7, -1)
    assert torch.allclose(entropy.detach(), -(p * p.log()).sum(-1), atol=1e-5)


def test_sampling_draws_each_token_with_its_probability_and_top_p_drops_the_tail():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(40_000, 1)
    u = torch.rand(40_000, generator=torch.Generator().manual_seed(1))
    want = torch.softmax(logits[0] / 0.8, -1)
    got = torch.bincount(grpo._pick(logits, 0.8, 1.0, u), minlength=5).float() / 40_000
    assert torch.allclose(got, want, atol=0.01), (got, want)
    # top_p 0.8: the likeliest tokens reaching 0.8, renormalized; the rest never drawn
    kept = grpo._pick(logits, 0.8, 0.8, u)
    p = want[:2] / want[:2].sum()
    assert set(kept.tolist()) == {0, 1}
    assert abs(float((kept == 0).float().mean()) - float(p[0])) < 0.01
    # u at its edges: never an impossible token
    edges = torch.tensor([0.0, 1.0 - 2**-24])
    assert grpo._pick(logits[:2], 0.8, 0.8, edges).tolist() == [0, 1]
    assert grpo._pick(logits[:2], 0.8, 1.0, edges).tolist() == [0, 3]


def test_sampling_in_smaller_batches_draws_the_same_completions(model_dir):
    pre = open_pretrained(str(model_dir))
    cfg = apply_pretrained(validate(grpo_config(model_dir)), pre)
    model = build_model(cfg, pre, torch.device("cpu"), "fp32", lambda m: None)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15], [16], [17, 18, 19, 20]]
    u = torch.rand((5, 8), generator=torch.Generator().manual_seed(3))
    whole = grpo.sample(model, prompts, 8, 1.0, 0.9, [7], 0, u, "cpu", "fp32")
    parts = [
        grpo.sample(model, prompts[s : s + 2], 8, 1.0, 0.9, [7], 0, u[s : s + 2], "cpu", "fp32")
        for s in (0, 2, 4)
    ]
    for a, b in zip(whole, grpo.joined(parts, 0), strict=True):
        assert torch.equal(a, b)


def test_batched_kv_cache_sampling_decodes_and_scores_as_each_prompt_alone(model_dir):
    pre = open_pretrained(str(model_dir))
    cfg = apply_pretrained(validate(grpo_config(model_dir)), pre)
    model = build_model(cfg, pre, torch.device("cpu"), "fp32", lambda m: None).eval()
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    u = torch.rand((3, 5), generator=torch.Generator().manual_seed(0))
    # Near-zero temperature: the left-padded batch with the KV cache picks each prompt's
    # greedy continuation from its own full forward.
    _, _, out, mask, _ = grpo.sample(model, prompts, 5, 1e-4, 1.0, [], 0, u, "cpu", "fp32")
    for i, p in enumerate(prompts):
        ids = list(p)
        for _ in range(5):
            logits = model.logits(torch.tensor([ids]))
            ids.append(int(logits[0, -1].argmax()))
        assert out[i].tolist() == ids[len(p) :], i
    assert mask.all()  # no stop token given: every completion runs to its length
    # The training pass over the padded batch gives each row its own log-probs.
    ids, valid = grpo.left_padded(prompts, 0)
    batched = model.logits(
        torch.cat((ids, out), 1),
        segments=torch.cat((valid, torch.ones_like(out, dtype=torch.bool)), 1).long(),
    )
    for i, p in enumerate(prompts):
        alone = model.logits(torch.tensor([p + out[i].tolist()]))
        want = torch.log_softmax(alone[0, len(p) - 1 : -1], -1)
        got = torch.log_softmax(batched[i, ids.shape[1] - 1 : -1], -1)
        assert torch.allclose(got, want, atol=1e-5), i


# -- runs ----------------------------------------------------------------------------------------


def test_a_tiny_model_learns_a_verifiable_task_starting_low(model_dir, tmp_path):
    Trainer(grpo_config(model_dir), tmp_path / "run").run()
    train, _ = read_metrics(tmp_path / "run" / "metrics.jsonl")
    rewards_ = [r["reward"] for r in train]
    assert len(rewards_) == 25
    assert sum(rewards_[:5]) / 5 <= 0.2 and sum(rewards_[-5:]) / 5 >= 0.6, rewards_
    last = train[-1]
    for name in (
        "reward",
        "reward_std",
        "rewards/regex/mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "entropy",
        "frac_reward_zero_std",
    ):
        assert name in last
    assert "kl" not in last  # beta 0: no reference, no kl
    table = (tmp_path / "run" / "completions.jsonl").read_text().splitlines()
    latest = json.loads(table[-1])
    assert latest["step"] == 25 and len(latest["rows"]) == 32
    row = latest["rows"][0]
    assert set(row) >= {"prompt", "completion", "rewards", "reward", "advantage"}
    assert "What is" in row["prompt"]


def test_beta_zero_makes_no_reference_pass_and_lora_beta_uses_adapters_off(
    model_dir, tmp_path, monkeypatch
):
    calls = []
    real = lora.adapters_disabled

    def counting(model):
        calls.append(1)
        return real(model)

    monkeypatch.setattr(lora, "adapters_disabled", counting)
    short = dict(max_steps=2, lora_rank=4)
    Trainer(grpo_config(model_dir, **short), tmp_path / "zero").run()
    assert calls == []
    Trainer(grpo_config(model_dir, grpo_beta=0.1, **short), tmp_path / "beta").run()
    assert len(calls) == 2  # one reference pass a micro-batch
    train, _ = read_metrics(tmp_path / "beta" / "metrics.jsonl")
    assert train[0]["kl"] == pytest.approx(0.0, abs=1e-7)  # the adapters start at zero
    assert train[1]["kl"] > 0
    # A full fine-tune's reference: a frozen copy of the starting weights.
    Trainer(grpo_config(model_dir, grpo_beta=0.1, max_steps=2), tmp_path / "full").run()
    train, _ = read_metrics(tmp_path / "full" / "metrics.jsonl")
    assert train[0]["kl"] == pytest.approx(0.0, abs=1e-7) and train[1]["kl"] > 0


def test_resume_mid_run_is_bitwise_the_straight_run(model_dir, tmp_path):
    cfg = grpo_config(
        model_dir, max_steps=6, dropout=0.1, lora_rank=4, grad_accum=2, batch_size=2, ckpt_every=3
    )
    Trainer(cfg, tmp_path / "straight").run()
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(3))
    Trainer(
        cfg, tmp_path / "split", resume_from=tmp_path / "split" / "checkpoints" / "latest.pt"
    ).run()
    a, _ = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    b, _ = read_metrics(tmp_path / "split" / "metrics.jsonl")
    keys = ("loss", "reward", "reward_std", "entropy", "completions/mean_length")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    wa = torch.load(tmp_path / "straight" / "checkpoints" / "latest.pt", weights_only=False)
    wb = torch.load(tmp_path / "split" / "checkpoints" / "latest.pt", weights_only=False)
    for name, tensor in wa["model"].items():
        assert torch.equal(tensor, wb["model"][name]), name
    steps = [
        json.loads(line)["step"]
        for line in (tmp_path / "split" / "completions.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_an_out_of_memory_step_is_redone_with_the_same_completions(model_dir, tmp_path):
    fired = []

    def oom(step, micro):
        if (step, micro) == (2, 0) and not fired:
            fired.append(step)
            raise torch.OutOfMemoryError("CUDA out of memory")

    cfg = grpo_config(model_dir, max_steps=3, batch_size=4, grad_accum=1)
    Trainer(cfg, tmp_path / "oom", fault=oom).run()
    Trainer(cfg, tmp_path / "plain").run()
    a, _ = read_metrics(tmp_path / "oom" / "metrics.jsonl")
    b, _ = read_metrics(tmp_path / "plain" / "metrics.jsonl")
    assert fired and a[1]["batch_size"] == 2
    # Steps 1 and 2 sample from the same weights with the same draws. Step 2's gradient sums
    # 2x2 rows instead of 4, in another order, so step 3 samples from weights equal to
    # rounding only, where one token may come out otherwise (two completions' worth of 32).
    assert [r["reward"] for r in a[:2]] == [r["reward"] for r in b[:2]]
    assert a[1]["loss"] == pytest.approx(b[1]["loss"], rel=1e-4, abs=1e-6)
    assert a[2]["reward"] == pytest.approx(b[2]["reward"], abs=2 / 32)


def test_out_of_memory_while_sampling_halves_it_with_the_same_draws(
    model_dir, tmp_path, monkeypatch
):
    real, fired = grpo.sample, []

    def small_memory(model, prompts, *args):
        if len(prompts) > 8:  # only 8 completions fit at once
            fired.append(len(prompts))
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(model, prompts, *args)

    cfg = grpo_config(model_dir, max_steps=3, batch_size=4, grad_accum=1, eval_every=3)
    Trainer(cfg, tmp_path / "plain").run()
    monkeypatch.setattr(grpo, "sample", small_memory)
    Trainer(cfg, tmp_path / "small").run()
    assert fired == [32, 16]  # 32 rows, then 16, then 8 at a time for the rest of the run
    a, evals_a = read_metrics(tmp_path / "plain" / "metrics.jsonl")
    b, evals_b = read_metrics(tmp_path / "small" / "metrics.jsonl")
    keys = ("reward", "reward_std", "completions/mean_length", "loss")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    assert [e["eval_reward"] for e in evals_a] == [e["eval_reward"] for e in evals_b]
    assert b[0]["batch_size"] == 4  # the training pass was not shrunk
    log = (tmp_path / "small" / "train.log").read_text(encoding="utf-8")
    assert "out of memory sampling at step 1: 16 completions at a time (was 32)" in log
    assert "8 completions at a time (was 16)" in log


TRL_STYLE = """
def lucky(prompts, completions, completion_ids, answer, trainer_state, log_extra, log_metric,
          **kwargs):
    assert completions[0][0]["role"] == "assistant"
    assert len(answer) == len(completions) == len(completion_ids) == len(prompts)
    log_metric("custom/seen", float(len(completions)))
    log_metric("custom/step", float(trainer_state.global_step))
    log_metric("custom/epoch", trainer_state.epoch)
    log_extra("note", ["x"] * len(completions))
    # None: this function does not apply to the first completion of each batch
    return [None if i == 0 else float(len(ids) % 2) for i, ids in enumerate(completion_ids)]

def raises(completions, **kwargs):
    out = []
    for c in completions:
        if "{" in c[0]["content"] or True:
            raise ValueError("cannot parse")
    return out

def short(completions, **kwargs):
    return [1.0]
"""


def test_a_trl_reward_file_runs_unchanged(model_dir, tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(TRL_STYLE)
    cfg = grpo_config(
        model_dir, reward=[f"{path}:lucky", "answer"], reward_weights="0.5,1", max_steps=2
    )
    Trainer(cfg, tmp_path / "run").run()
    train, _ = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert train[0]["custom/seen"] == 32.0
    # TRL's trainer_state: optimizer steps done, and the fraction of the prompts drawn so far
    n_train = 64 - int(64 * cfg.val_fraction)  # tests/fixtures/arithmetic.jsonl's 64 prompts
    assert [r["custom/step"] for r in train] == [0.0, 1.0]
    assert train[1]["custom/epoch"] == pytest.approx(cfg.batch_size / n_train)
    assert 0.0 <= train[0]["rewards/lucky/mean"] <= 1.0 and "rewards/answer/mean" in train[0]
    latest = json.loads((tmp_path / "run" / "completions.jsonl").read_text().splitlines()[-1])
    assert latest["rows"][0]["rewards"]["lucky"] is None and latest["rows"][0]["note"] == "x"


def test_rewards_read_completions_without_special_tokens_as_trls_do(model_dir, tmp_path):
    from types import SimpleNamespace

    t = Trainer(grpo_config(model_dir, max_steps=1), tmp_path / "run")
    t._setup()
    tok = t.data.tokenizer
    text = tok.hf.encode("5 apples", add_special_tokens=False).ids
    out = torch.tensor([[tok.hf.token_to_id("<|endoftext|>"), *text]])
    state = SimpleNamespace(global_step=0, epoch=0.0)
    scores, completions = t.objective._score(
        t.data, tok, [0], out, torch.ones_like(out, dtype=torch.bool), state
    )
    assert completions[0][0]["content"] == "5 apples"  # TRL: skip_special_tokens=True
    assert float(scores[0, 0]) == 1.0  # the regex sees the digit first
    t._end("stopped")


def test_the_built_in_answer_reward_reads_gsm8k_boxed_and_numbers():
    completions = ["so #### 1,000", "\\boxed{42}", "<answer>7</answer>", "it is 3.0", "nope"]
    got = rewards.answer(completions, answer=["1000", "#### 42", "7", "3", "4"])
    assert got == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert rewards.think_format(["<think>a</think><answer>b</answer>", "b"]) == [1.0, 0.0]
    assert rewards.make_length(4)(completion_ids=[[1] * 4, [1] * 2, [1] * 9]) == [1.0, 0.5, 0.0]


@pytest.mark.parametrize(
    ("reward", "expected"),
    [
        ("nonsense", "reward: unknown reward 'nonsense'"),
        ("{dir}/missing.py:f", "no file"),
        ("{dir}/my_rewards.py:nothing", "has no function 'nothing'"),
        ("{dir}/no_answers.jsonl", "answer compares with the data's answer column"),
        ("{dir}/my_rewards.py:raises", "reward raises raised ValueError: cannot parse (data row"),
        (
            "{dir}/my_rewards.py:short",
            "reward short returned 1 values for 3 completions (data rows",
        ),
    ],
)
def test_bad_rewards_are_one_line_exit_2_naming_the_function(
    model_dir, tmp_path, capsys, reward, expected
):
    (tmp_path / "my_rewards.py").write_text(TRL_STYLE)
    data = ARITHMETIC
    if reward.endswith(".jsonl"):  # prompts without the answer column the answer reward reads
        data = Path(reward.format(dir=tmp_path))
        data.write_text('{"prompt": "What is 2 + 2?"}\n', encoding="utf-8")
        reward = "answer"
    argv = [
        "--init-from",
        str(model_dir),
        "--data",
        str(data),
        "--method",
        "grpo",
        "--reward",
        reward.format(dir=tmp_path),
        "--max-steps",
        "1",
        "--seq-len",
        "64",
        "--max-completion-tokens",
        "6",
        "--num-generations",
        "8",
        "--batch-size",
        "4",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "r"),
    ]
    assert train_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], err
    if "raised" not in expected and "returned" not in expected:  # before the model loads
        assert not (tmp_path / "r").exists()


def test_grpo_settings_are_checked_with_the_config(model_dir):
    with pytest.raises(ConfigError, match="needs at least one reward"):
        grpo_config(model_dir, reward=[])
    with pytest.raises(ConfigError, match="regex needs its pattern"):
        grpo_config(model_dir, reward_regex=None)
    with pytest.raises(ConfigError, match="2 weights for 1 rewards"):
        grpo_config(model_dir, reward_weights="1,2")
    with pytest.raises(ConfigError, match="method: grpo tunes a model"):
        tiny_config(method="grpo", reward=["answer"])


def test_the_estimate_counts_the_kv_cache_of_the_g_completions(model_dir):
    from dataclasses import replace

    from core.training.estimate import estimate

    cfg = apply_pretrained(grpo_config(model_dir), open_pretrained(str(model_dir)))
    a, b = estimate(cfg, "fp32"), estimate(replace(cfg, num_generations=16), "fp32")
    assert a.generation > 0 and b.generation == 2 * a.generation
    assert b.activations == pytest.approx(2 * a.activations, rel=0.05)  # G rows a prompt
    assert "sampling (KV cache, G x B)" in a.report()
    sft = estimate(replace(cfg, method="sft"), "fp32")
    assert sft.generation == 0 and a.activations > sft.activations


def test_a_4bit_base_with_lora_and_beta_trains(model_dir, tmp_path):
    pytest.importorskip("bitsandbytes")
    cfg = grpo_config(model_dir, lora_rank=4, base_bits="4", grpo_beta=0.05, max_steps=2)
    result = Trainer(cfg, tmp_path / "run").run()
    assert result["status"] == "finished"
    train, _ = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert train[0]["kl"] == pytest.approx(0.0, abs=1e-6) and math.isfinite(train[1]["kl"])


def test_reward_is_repeatable_on_the_command_line():
    from core.cli.train import _overrides, build_parser

    args = build_parser().parse_args(
        ["--reward", "answer", "--reward", "my.py:f", "--reward-weights", "1,0.5"]
    )
    values = _overrides(args)
    assert values["reward"] == ["answer", "my.py:f"] and values["reward_weights"] == "1,0.5"


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_the_loss_equals_trls_own_on_the_same_model_and_completions(model_dir, tmp_path, loss_type):
    """TRL's GRPOTrainer._compute_loss and ours on the same weights, prompts (of one length:
    TRL gives left padding no positions of its own), completions, advantages and reference
    log-probs."""
    pytest.importorskip("trl")
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.pad_token = tok.pad_token or tok.eos_token
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=4,
        beta=0.04,
        loss_type=loss_type,
        max_completion_length=5,
        gradient_checkpointing=False,
    )
    trl = GRPOTrainer(
        model=hf,
        reward_funcs=lambda completions, **k: [0.0] * len(completions),
        args=args,
        processing_class=tok,
        train_dataset=datasets.Dataset.from_list([{"prompt": "a"}] * 4),
    )
    trl.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    prompts = torch.randint(3, 300, (4, 6))
    completions = torch.randint(3, 300, (4, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])
    adv = torch.tensor([1.0, -0.5, 0.25, -0.75])
    ref = torch.randn(4, 5) - 3.0
    inputs = {
        "prompt_ids": prompts,
        "prompt_mask": torch.ones_like(prompts),
        "completion_ids": completions,
        "completion_mask": mask,
        "advantages": adv,
        "num_items_in_batch": mask.sum(),
        "ref_per_token_logps": ref,
    }
    trl.model.train()
    want = float(trl._compute_loss(trl.model, inputs).detach())

    pre = open_pretrained(str(model_dir))
    cfg = apply_pretrained(
        grpo_config(model_dir, grpo_beta=0.04, loss_type=loss_type, max_completion_tokens=5), pre
    )
    ours = build_model(cfg, pre, torch.device("cpu"), "fp32", lambda m: None)
    logits = ours.logits(torch.cat((prompts, completions), 1))
    logps, _ = plain_token_logps(logits[:, 5:-1], completions, 1.0)
    loss, _, _ = grpo.policy_loss(logps, logps.detach(), ref, adv, mask, cfg, float(mask.sum()))
    assert float(loss.detach()) == pytest.approx(want, rel=1e-5, abs=1e-6)
