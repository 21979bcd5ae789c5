"""Preference tuning (DPO) on a tiny random Qwen2-shaped model built with transformers' own
config class: the loss and TRL's reward signals, the reference (adapters off, or cached),
exact resume, SFT then DPO, and one-line refusals."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from helpers import StopAfter, tiny_config  # noqa: E402
from hf_models import make_model  # noqa: E402

from core.cli.train import main as train_main  # noqa: E402
from core.models import lora  # noqa: E402
from core.runs.events import TrainEvents  # noqa: E402
from core.runs.folder import read_metrics  # noqa: E402
from core.training import dpo  # noqa: E402
from core.training.trainer import Trainer  # noqa: E402
from core.weights.loader import load  # noqa: E402


def pair(i: int) -> dict:
    """Separable: the chosen answers always end one way, the rejected ones another."""
    return {
        "prompt": f"Add {i} and {i + 1}.",
        "chosen": f"{2 * i + 1}. Done!",
        "rejected": f"{2 * i + 1}. Hmm?",
    }


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo")
    make_model(root / "model", "qwen2")
    data = write_jsonl(root / "pairs.jsonl", [pair(i) for i in range(40)])
    cfg = tiny_config(
        init_from=str(root / "model"),
        tokenizer="model",
        data=data,
        method="dpo",
        lora_rank=4,
        lr=1e-2,
        seq_len=48,
        dropout=0.0,
        max_steps=12,
        eval_every=6,
        ckpt_every=6,
        sample_tokens=0,
        val_fraction=0.1,
        warmup_steps=1,
    )
    return root, cfg


@pytest.fixture(scope="module")
def lora_run(setup, tmp_path_factory):
    _, cfg = setup
    trainer = Trainer(cfg, tmp_path_factory.mktemp("runs") / "lora")
    trainer.run()
    return trainer


def test_step_zero_is_ln2_with_zero_rewards_and_a_short_run_learns_the_preference(lora_run):
    train, evals = read_metrics(lora_run.folder.path / "metrics.jsonl")
    first, base = train[0], evals[0]
    assert base["step"] == 0 and base["val_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    for name in dpo.SIGNALS:
        assert first[name] == 0.0 and base[f"eval_{name}"] == 0.0
    last = evals[-1]
    assert last["eval_rewards/margins"] > 0.5 and last["eval_rewards/accuracies"] == 1.0
    assert last["val_loss"] < 0.5 * math.log(2)
    assert train[-1]["rewards/accuracies"] > first["rewards/accuracies"]
    assert train[-1]["rewards/margins"] > 0


def test_evaluation_keeps_no_autograd_graph(lora_run):
    """Held-out pairs are scored without the graph a backward would need: an evaluation
    must not hold more memory than a training step."""
    seen = []
    hook = lora_run.model.register_forward_hook(lambda *_: seen.append(torch.is_grad_enabled()))
    try:
        lora_run.evaluate()
    finally:
        hook.remove()
    assert seen and not any(seen)


def direct_logps(model, x, y, mask) -> torch.Tensor:
    """Each row's answer log-probability from its own forward pass and full logits."""
    out = []
    for i in range(len(x)):
        logits = model.logits(x[i : i + 1])
        logp = F.log_softmax(logits.float(), dim=-1)[0].gather(1, y[i][:, None])[:, 0]
        out.append((logp * mask[i]).sum())
    return torch.stack(out)


def test_loss_and_rewards_equal_a_direct_computation(lora_run):
    t = lora_run
    starts = t.data.val_pair_starts(3)
    x, y, mask, pair_ids = t.data.pair_batch(starts, val=True)
    t.model.eval()
    with torch.no_grad():
        batched, _ = dpo.answer_logps(t.model, t.model, x, y, mask)
        policy = direct_logps(t.model, x, y, mask)
        with lora.adapters_disabled(t.model):
            ref = direct_logps(t.model, x, y, mask)
        ref_c, ref_r = t.reference(x, y, mask, pair_ids, "fp32")
    # sums of ~100 nats: float32 resolves them to about 1e-5
    torch.testing.assert_close(batched, policy, atol=1e-5, rtol=1e-6)
    n = len(starts)
    torch.testing.assert_close(ref_c, ref[:n], atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(ref_r, ref[n:], atol=1e-5, rtol=1e-6)
    beta = t.cfg.dpo_beta
    losses, rc, rr = dpo.dpo_loss(policy[:n], policy[n:], ref[:n], ref[n:], beta)
    margin = beta * ((policy[:n] - ref[:n]) - (policy[n:] - ref[n:]))
    torch.testing.assert_close(losses, -F.logsigmoid(margin), atol=1e-5, rtol=0)
    torch.testing.assert_close(rc, beta * (policy[:n] - ref[:n]), atol=1e-5, rtol=0)
    assert float((policy[:n] - policy[n:]).abs().max()) > 0  # the pairs' answers differ


def test_adapters_off_reproduce_the_starting_models_log_probs_exactly(setup, lora_run):
    t = lora_run
    x, y, mask, _ = t.data.pair_batch(t.data.val_pair_starts(2), val=True)
    base = load(setup[1].init_from).model
    with torch.no_grad(), lora.adapters_disabled(t.model):
        t.model.eval()
        off, _ = dpo.answer_logps(t.model, t.model, x, y, mask)
        start, _ = dpo.answer_logps(base, base, x, y, mask)
    assert torch.equal(off, start)


def run_losses(folder) -> list:
    train, evals = read_metrics(folder / "metrics.jsonl")
    return [(r["loss"], r["rewards/margins"]) for r in train] + [
        (r["val_loss"], r["eval_rewards/margins"]) for r in evals
    ]


class Logs(TrainEvents):
    def __init__(self):
        self.lines = []

    def on_log(self, message):
        self.lines.append(message)


def test_full_fine_tuning_caches_the_reference_and_resumes_bitwise(setup, tmp_path):
    root, cfg = setup
    cfg = tiny_config(
        **{
            **_fields(cfg),
            "lora_rank": 0,
            "lr": 1e-3,
            "max_steps": 6,
            "eval_every": 3,
            "ckpt_every": 3,
            "log_every": 1,
        }
    )
    logs = Logs()
    Trainer(cfg, tmp_path / "straight").run(logs)
    assert any("reference log-probs of" in line and "computed" in line for line in logs.lines)
    Trainer(cfg, tmp_path / "split").run(None, StopAfter(4))
    logs = Logs()
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    Trainer(cfg, tmp_path / "split", resume_from=latest).run(logs)
    assert any("reference log-probs reused" in line for line in logs.lines)
    assert run_losses(tmp_path / "split") == run_losses(tmp_path / "straight")
    # another model (other weights) gets a reference of its own, not the cached one
    make_model(root / "other-model", "qwen2", seed=1)
    logs = Logs()
    other = tiny_config(**{**_fields(cfg), "init_from": str(root / "other-model"), "max_steps": 1})
    Trainer(other, tmp_path / "other").run(logs)
    assert any("computed" in line for line in logs.lines if "reference" in line)
    # other data (one pair more) too
    more = write_jsonl(tmp_path / "more.jsonl", [pair(i) for i in range(41)])
    logs = Logs()
    Trainer(tiny_config(**{**_fields(cfg), "data": more, "max_steps": 1}), tmp_path / "more").run(
        logs
    )
    assert any("computed" in line for line in logs.lines if "reference" in line)


def _fields(cfg) -> dict:
    return {k: v for k, v in cfg.to_dict().items() if k != "config_version"}


def test_sft_then_dpo_starts_from_the_sft_model(setup, tmp_path):
    root, cfg = setup
    chat = write_jsonl(
        root / "chat.jsonl",
        [
            {"prompt": f"Add {i} and {i + 1}.", "completion": f"{2 * i + 1}. Done!"}
            for i in range(20)
        ],
    )
    common = [
        "--init-from",
        cfg.init_from,
        "--seq-len",
        "48",
        "--lora-rank",
        "4",
        "--device",
        "cpu",
        "--data-cache",
        str(tmp_path / "cache"),
        "--eval-every",
        "3",
        "--sample-tokens",
        "0",
        "--lr",
        "1e-2",
    ]
    assert (
        train_main([*common, "--data", chat, "--max-steps", "3", "--out", str(tmp_path / "sft")])
        == 0
    )
    common[1] = str(tmp_path / "sft")
    assert (
        train_main(
            [
                *common,
                "--data",
                cfg.data,
                "--method",
                "dpo",
                "--max-steps",
                "1",
                "--out",
                str(tmp_path / "dpo"),
            ]
        )
        == 0
    )
    sft = load(tmp_path / "sft").model
    dpo_run = load(tmp_path / "dpo", "latest")
    base_eval = read_metrics(tmp_path / "dpo" / "metrics.jsonl")[1][0]
    assert base_eval["val_loss"] == pytest.approx(math.log(2), abs=1e-6)
    ids = torch.tensor([[5, 9, 17, 33, 2, 40, 41]])
    with torch.no_grad(), lora.adapters_disabled(dpo_run.model):
        torch.testing.assert_close(dpo_run.model.logits(ids), sft.logits(ids), atol=1e-5, rtol=0)
    plain = load(cfg.init_from).model  # the SFT model is not the original base
    assert not torch.allclose(sft.logits(ids), plain.logits(ids), atol=1e-4)


@pytest.mark.parametrize(
    "rows, flags, expected",
    [
        ([{"prompt": "a", "rejected": "b"}] * 3, [], "line 1: 'chosen' is missing"),
        (
            [pair(0), {"prompt": "a", "chosen": "b", "rejected": "b"}],
            [],
            "line 2: 'chosen' and 'rejected' are the same answer",
        ),
        ([pair(0), pair(1)], ["--method", "sft"], "holds preference pairs"),
        ([{"prompt": "a", "completion": "b"}] * 3, [], "method: dpo learns from preference pairs"),
        (
            [
                pair(0),
                {
                    "prompt": "Say it. " * 40,
                    "chosen": "Same start " * 30 + "good",
                    "rejected": "Same start " * 30 + "bad",
                },
            ],
            [],
            "pair 2 of",
        ),
    ],
)
def test_bad_preference_input_is_one_line_exit_2(setup, tmp_path, capsys, rows, flags, expected):
    _, cfg = setup
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    argv = [
        "--init-from",
        cfg.init_from,
        "--data",
        data,
        "--method",
        "dpo",
        "--max-steps",
        "1",
        "--data-cache",
        str(tmp_path / "c"),
        "--out",
        str(tmp_path / "r"),
        *flags,
    ]
    assert train_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]  # beside a progress bar
    assert len(errors) == 1 and expected in errors[0] and err[-1] == errors[0], err
    assert not (tmp_path / "r").exists()


def test_dpo_on_plain_text_or_without_a_start_model_is_refused(setup, tmp_path, capsys):
    _, cfg = setup
    text = tmp_path / "t.txt"
    text.write_text("plain text " * 200, encoding="utf-8")
    base = ["--method", "dpo", "--max-steps", "1", "--out", str(tmp_path / "r")]
    assert train_main([*base, "--init-from", cfg.init_from, "--data", str(text)]) == 2
    assert "holds plain text" in capsys.readouterr().err
    assert train_main([*base, "--data", cfg.data]) == 2
    assert "method: dpo tunes a model that can already answer" in capsys.readouterr().err


def test_pairs_in_a_parquet_table_with_other_column_names_prepare_as_the_jsonl(setup, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from core.data.prepare import data_spec, prepare
    from core.weights.loader import open_pretrained

    _, cfg = setup
    rows = [pair(i) for i in range(12)]
    table = {
        "question": [r["prompt"] for r in rows],
        "good": [r["chosen"] for r in rows],
        "bad": [r["rejected"] for r in rows],
    }
    pq.write_table(pa.table(table), tmp_path / "pairs.parquet")
    jsonl = write_jsonl(tmp_path / "pairs.jsonl", rows)
    tokenizer = open_pretrained(cfg.init_from).tokenizer
    cache = tmp_path / "cache"
    mapped = tiny_config(
        **{
            **_fields(cfg),
            "data": str(tmp_path / "pairs.parquet"),
            "prompt_column": "question",
            "chosen_column": "good",
            "rejected_column": "bad",
        }
    )
    plain = tiny_config(**{**_fields(cfg), "data": jsonl})
    outs = [prepare(data_spec(c), cache, tokenizer, log=lambda m: None) for c in (mapped, plain)]
    (a, ma), (b, mb) = outs
    assert ma["data_format"] == mb["data_format"] == "preference"
    assert ma["examples"]["train"] + ma["examples"]["val"] == 12
    for name in ("tokens.bin", "mask.bin"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_out_of_memory_halves_the_pairs_a_micro_batch_and_keeps_the_step(setup, tmp_path):
    _, cfg = setup
    cfg = tiny_config(**{**_fields(cfg), "max_steps": 4, "log_every": 1, "eval_every": 4})
    fired = []

    def fault(step, micro):
        if (step, micro) == (3, 0) and not fired:
            fired.append(step)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    Trainer(cfg, tmp_path / "straight").run()
    result = Trainer(cfg, tmp_path / "oom", fault=fault).run()
    assert result["status"] == "finished" and fired == [3]
    straight = read_metrics(tmp_path / "straight" / "metrics.jsonl")[0]
    oom = read_metrics(tmp_path / "oom" / "metrics.jsonl")[0]
    assert [(r["batch_size"], r["grad_accum"]) for r in oom][-1] == (2, 2)
    for a, b in zip(straight, oom, strict=True):  # the same pairs, the same mean
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
        assert a["rewards/margins"] == pytest.approx(b["rewards/margins"], rel=1e-4, abs=1e-6)


def test_a_dpo_runs_merged_export_loads_in_transformers_with_equal_logits(lora_run, tmp_path):
    from transformers import AutoModelForCausalLM

    from core.use.export import export

    export(lora_run.folder.path, "hf", tmp_path / "hf", log=lambda m: None)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ours = load(lora_run.folder.path).model
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours.logits(ids), atol=1e-4, rtol=0)


def test_the_estimate_counts_two_sequences_a_pair(setup):
    from core.training.estimate import estimate

    _, cfg = setup
    dpo_cfg = tiny_config(**{**_fields(cfg), "seq_len": 64, "batch_size": 8})
    sft = tiny_config(**{**_fields(dpo_cfg), "method": "sft", "data_format": "chat"})
    a, b = estimate(sft, on_gpu=True), estimate(dpo_cfg, on_gpu=True)
    assert b.activations == pytest.approx(2 * a.activations, rel=0.05)
    assert b.weights == a.weights and b.optimizer == a.optimizer


def test_an_epoch_is_one_pass_over_the_pairs(setup, tmp_path):
    _, cfg = setup
    cfg = tiny_config(**{**_fields(cfg), "max_steps": None, "max_epochs": 1.0, "batch_size": 4})
    trainer = Trainer(cfg, tmp_path / "epoch")
    trainer.run()
    pairs = trainer.data.manifest["examples"]["train"]
    assert trainer.step == pytest.approx(pairs / 4, abs=1)


def test_dpo_on_a_mixture_of_experts_adds_its_aux_loss_and_resumes_bitwise(setup, tmp_path):
    """As on a dense model, with each expert's adapters, the router trained and the
    load-balancing loss joined: step 1's loss is ln 2 (policy = reference) plus coefficient
    x the logged aux loss."""
    _, cfg = setup
    make_model(tmp_path / "moe", "qwen3_moe")
    changes = {
        "init_from": str(tmp_path / "moe"),
        "max_steps": 2,
        "log_every": 1,
        "eval_every": 2,
        "ckpt_every": 1,
        "router_aux_loss": 0.05,
        "lora_experts": True,
        "train_router": True,
    }
    moe_cfg = tiny_config(**{**_fields(cfg), **changes})
    Trainer(moe_cfg, tmp_path / "straight").run()
    Trainer(moe_cfg, tmp_path / "split").run(None, StopAfter(1))
    latest = tmp_path / "split" / "checkpoints" / "latest.pt"
    Trainer(moe_cfg, tmp_path / "split", resume_from=latest).run()
    straight = read_metrics(tmp_path / "straight" / "metrics.jsonl")[0]
    split = read_metrics(tmp_path / "split" / "metrics.jsonl")[0]
    assert [r["loss"] for r in split] == [r["loss"] for r in straight]
    first = straight[0]
    assert first["moe/aux_loss"] > 0.5
    assert first["loss"] == pytest.approx(math.log(2) + 0.05 * first["moe/aux_loss"], abs=1e-6)
    # the reference (adapters off) is the starting model, its router too, not the trained one
    tuned, start = load(tmp_path / "straight").model, load(tmp_path / "moe").model
    x = torch.arange(3, 40)[None]
    router = tuned.blocks[0].mlp.router.weight
    assert not torch.equal(router, start.blocks[0].mlp.router.weight)
    with torch.no_grad(), lora.adapters_disabled(tuned):
        assert torch.equal(tuned.logits(x), start.logits(x))
    assert not torch.equal(tuned.logits(x), start.logits(x))
    assert not torch.equal(router, start.blocks[0].mlp.router.weight)  # put back


def test_pairs_cut_to_the_context_are_counted_in_the_log_and_the_window(setup, tmp_path):
    from core.data import preference
    from core.data.chat import special_tokens, template_of
    from core.data.describe import describe_data
    from core.data.prepare import data_spec, examples_line, prepare
    from core.weights.loader import open_pretrained

    _, cfg = setup
    rows = [pair(i) for i in range(10)]
    for i in (4, 6, 8):  # long prompts: their sides pass seq_len 48
        rows[i]["prompt"] = f"Add {i} and {i + 1}, " + "please " * (8 * i)
    long_cfg = tiny_config(**{**_fields(cfg), "data": write_jsonl(tmp_path / "p.jsonl", rows)})
    tokenizer = open_pretrained(cfg.init_from).tokenizer
    template, tokens = template_of(tokenizer), special_tokens(tokenizer)

    def side(r, key):  # a side's tokens as the template renders it, before any cut
        prompt = [{"role": "user", "content": r["prompt"]}]
        answer = [{"role": "assistant", "content": r[key]}]
        return len(preference.encode_side(tokenizer, template, prompt, answer, tokens)[0])

    lengths = [[side(r, "chosen"), side(r, "rejected")] for r in rows]
    row = long_cfg.seq_len + 1
    long = [sides for sides in lengths if max(sides) > row]
    assert len(long) >= 2  # the long prompts pass the context, the others do not
    cut = sum(max(0, n - row) for sides in long for n in sides)
    said = (
        f"{len(long)} of 10 pairs had a side longer than seq_len 48 and were cut (longest "
        f"{max(map(max, lengths)):,} tokens; {cut:,} tokens lost)"
    )
    _, manifest = prepare(data_spec(long_cfg), tmp_path / "cache", tokenizer, log=lambda m: None)
    assert said in examples_line(manifest)  # the run's log line
    assert said in describe_data(long_cfg, tokenizer)  # the window's data line
