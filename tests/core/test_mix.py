"""Several data sources mixed by weight (core.data.mix) and Hugging Face dataset ids as data
(core.data.hub): shares honoured, exact resume, one-line refusals, split selection."""

from __future__ import annotations

import json
import random

import pytest
from helpers import StopAfter, tiny_config

from core.cli.train import main as train_main
from core.config.spec import TrainConfig, validate
from core.data import hub
from core.data.mix import MixedData, source_spec
from core.data.prepare import prepare
from core.data.windows import TokenData
from core.errors import CheckpointError, ConfigError, DataError
from core.runs.folder import read_metrics
from core.training.trainer import Trainer

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "seven", "owls")


def write_text(path, seed: int, n_bytes: int = 20_000):
    r = random.Random(seed)
    words = []
    while sum(len(w) + 1 for w in words) < n_bytes:
        words.append(r.choice(WORDS))
    path.write_text(" ".join(words), encoding="utf-8")
    return path


def write_chat(path, n: int = 120):
    r = random.Random(1)
    rows = []
    for _ in range(n):
        a, b = r.randint(0, 99), r.randint(0, 99)
        rows.append({"prompt": f"{a}+{b}=", "completion": str(a + b)})
    path.write_text("".join(json.dumps(x) + "\n" for x in rows), encoding="utf-8")
    return path


def prepared(cfg, src, cache, tokenizer=None) -> TokenData:
    folder, manifest = prepare(source_spec(cfg, src), cache, tokenizer, log=lambda m: None)
    return TokenData(folder, manifest, cfg.seq_len, cfg.seed)


def test_weights_are_honoured_within_three_hundredths(tmp_path):
    cfg = tiny_config()
    parts = [
        prepared(cfg, str(write_text(tmp_path / f"{i}.txt", i)), tmp_path / "c") for i in range(3)
    ]
    weights = [0.6, 0.3, 0.1]
    data = MixedData(parts, ["a", "b", "c"], weights, seed=0)
    picks = data.sample_starts(2000)
    for i, w in enumerate(weights):
        assert abs(float((picks[:, 0] == i).float().mean()) - w) <= 0.03
    # every window is read from the source it was drawn for
    x, y, mask, seg = data.train_batch(picks[:8])
    for row, (i, start) in enumerate(picks[:8].tolist()):
        assert x[row].tolist() == parts[i].train[start : start + cfg.seq_len].tolist()
    assert mask is None and seg is None  # text only: no mask needed


def test_chat_rows_and_text_windows_share_a_batch(tmp_path):
    cfg = tiny_config(seq_len=128)
    chat = prepared(cfg, str(write_chat(tmp_path / "c.jsonl")), tmp_path / "c")
    text = prepared(cfg, str(write_text(tmp_path / "t.txt", 0)), tmp_path / "c", chat.tokenizer)
    data = MixedData([chat, text], ["c", "t"], [0.5, 0.5], seed=0)
    picks = data.sample_starts(64)
    x, y, mask, seg = data.train_batch(picks)
    assert x.shape == y.shape == mask.shape == seg.shape == (64, 128)
    is_text = picks[:, 0] == 1
    assert bool(mask[is_text].eq(1).all()) and bool(seg[is_text].eq(0).all())
    # chat rows keep their answers-only mask and their packed examples' segments
    assert float(mask[~is_text].mean()) < 0.5 and int(seg[~is_text].max()) > 0
    assert data.tokenizer is chat.tokenizer  # the chat template travels with the run


def run_losses(run):
    train, evals = read_metrics(run / "metrics.jsonl")
    return [(r["step"], r["loss"]) for r in train], [
        {k: v for k, v in r.items() if k.startswith("val_loss")} for r in evals
    ]


def test_a_mixed_run_resumes_bitwise_equal_to_a_straight_one(tmp_path):
    chat = write_chat(tmp_path / "qa.jsonl")
    text = write_text(tmp_path / "general.txt", 0)
    cfg = tiny_config(
        data=str(chat),
        extra_data=[str(text)],
        data_weights="0.7,0.3",
        seq_len=96,
        max_steps=6,
        eval_every=3,
        ckpt_every=3,
        sample_tokens=0,
    )
    straight = tmp_path / "straight"
    Trainer(cfg, straight).run()
    run = tmp_path / "run"
    Trainer(cfg, run).run(control=StopAfter(4))
    Trainer(cfg, run, resume_from=run / "checkpoints" / "latest.pt").run()
    (train, evals) = run_losses(run)
    assert (train, evals) == run_losses(straight)  # exact float equality
    assert [s for s, _ in train] == list(range(1, 7))
    # each source's own validation loss beside the mixed one, their weighted mean
    last = evals[-1]
    assert set(last) == {"val_loss", "val_loss/qa.jsonl", "val_loss/general.txt"}
    mean = 0.7 * last["val_loss/qa.jsonl"] + 0.3 * last["val_loss/general.txt"]
    assert last["val_loss"] == pytest.approx(mean)
    log = (run / "train.log").read_text()
    assert "qa.jsonl 70.0%" in log and "general.txt 30.0%" in log
    info = json.loads((run / "data.json").read_text())  # the mix's totals and each source
    assert [m["name"] for m in info["mix"]] == ["qa.jsonl", "general.txt"]
    assert info["train_tokens"] == sum(m["train_tokens"] for m in info["mix"])


def test_a_changed_second_source_stops_resume(tmp_path):
    a, b = write_text(tmp_path / "a.txt", 0), write_text(tmp_path / "b.txt", 1)
    cfg = tiny_config(data=str(a), extra_data=[str(b)], max_steps=4, ckpt_every=2)
    run = tmp_path / "run"
    Trainer(cfg, run).run(control=StopAfter(2))
    write_text(b, 2)
    with pytest.raises(CheckpointError, match=f"data changed .*modified {b}"):
        Trainer(cfg, run, resume_from=run / "checkpoints" / "latest.pt").run()


def test_default_weights_follow_the_training_tokens(tmp_path):
    from core.data.mix import weights_of

    cfg = tiny_config()
    small = prepared(cfg, str(write_text(tmp_path / "s.txt", 0, 10_000)), tmp_path / "c")
    big = prepared(cfg, str(write_text(tmp_path / "b.txt", 1, 30_000)), tmp_path / "c")
    w = weights_of(cfg, [small, big])
    total = small.train_tokens + big.train_tokens
    assert w == pytest.approx([small.train_tokens / total, big.train_tokens / total])


@pytest.mark.parametrize(
    ("weights", "says"),
    [
        ("0.8;0.2", "expected numbers"),
        ("0.8,-0.2", "0 or more"),
        ("0,0", "above 0"),
        ("0.5,0.3,0.2", "3 weight(s) for 2 data source(s)"),
    ],
)
def test_bad_weights_are_one_line_exit_2_before_any_data(tmp_path, capsys, weights, says):
    a, b = write_text(tmp_path / "a.txt", 0), write_text(tmp_path / "b.txt", 1)
    cache = tmp_path / "cache"
    args = [
        "--preset",
        "cpu-tiny",
        "--data",
        str(a),
        "--data",
        str(b),
        "--data-weights",
        weights,
        "--out",
        str(tmp_path / "run"),
        "--data-cache",
        str(cache),
    ]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: data_weights:") and says in err and "\n" not in err
    assert not cache.exists() and not (tmp_path / "run").exists()


def test_repeated_data_flags_fill_data_and_extra_data():
    from core.cli.train import _overrides, build_parser

    args = build_parser().parse_args(["--data", r"C:\a.jsonl", "--data", "b.txt"])
    values = _overrides(args)
    assert (values["data"], values["extra_data"]) == (r"C:\a.jsonl", ["b.txt"])
    one = _overrides(build_parser().parse_args(["--data", "x.txt"]))
    assert (one["data"], one["extra_data"]) == ("x.txt", [])
    # a config.yaml written before the mix existed has neither field: one source, as before
    assert validate(TrainConfig(data="x.txt")).extra_data == []
    with pytest.raises(ConfigError, match="data_weights: 2 weight"):
        validate(TrainConfig(data="x.txt", data_weights="1,1"))


# -- Hugging Face dataset ids ---------------------------------------------------------------


def fake_snapshot(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_split_files_pick_the_split_named_in_the_path(tmp_path):
    snap = fake_snapshot(
        tmp_path / "a",
        {
            "data/train-00000-of-00002.parquet": "x",
            "data/train-00001-of-00002.parquet": "x",
            "data/test-00000-of-00001.parquet": "x",
            "README.md": "x",
        },
    )
    assert [p.name for p in hub.split_files(snap, "train")] == [
        "train-00000-of-00002.parquet",
        "train-00001-of-00002.parquet",
    ]
    assert [p.name for p in hub.split_files(snap, "test")] == ["test-00000-of-00001.parquet"]
    nested = fake_snapshot(
        tmp_path / "b",
        {
            "default/train/0000.parquet": "x",
            "default/validation/0000.parquet": "x",
        },
    )
    assert hub.split_files(nested, "validation") == [nested / "default/validation/0000.parquet"]
    with pytest.raises(
        DataError,
        match=r"data_split: .* split 'dev' \(splits found: train, "
        r"validation\); choose one with --data-split",
    ):
        hub.split_files(nested, "dev")
    plain = fake_snapshot(tmp_path / "c", {"qa.jsonl": "{}"})  # no split named: all is train
    assert hub.split_files(plain, "train") == [plain / "qa.jsonl"]


def test_a_hub_dataset_trains_from_the_hf_cache_without_network(tmp_path, monkeypatch):
    """A fake cached snapshot in the layout huggingface_hub keeps, read with the hub offline."""
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hf"
    repo = cache / "datasets--someone--qa"
    commit = "a" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    (snap / "data").mkdir(parents=True)
    write_chat(snap / "data" / "train-00000-of-00001.jsonl")
    write_chat(snap / "data" / "test-00000-of-00001.jsonl", n=10)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    assert hub.is_hub_id("someone/qa") and not hub.is_hub_id(str(tmp_path))
    cfg = tiny_config(data="someone/qa", seq_len=128, max_steps=2, eval_every=2)
    spec = source_spec(cfg, cfg.data)
    assert spec.chat is not None
    assert [p.name for p in spec.sources.files] == ["train-00000-of-00001.jsonl"]
    result = Trainer(cfg, tmp_path / "run").run()
    assert result["status"] == "finished"
    # not cached and no network: one line saying what to do
    missing = tiny_config(data="someone/absent")
    with pytest.raises(DataError, match="not in the Hugging Face cache"):
        source_spec(missing, missing.data)


def test_prepare_only_prepares_every_source(tmp_path, capsys):
    a, b = write_text(tmp_path / "a.txt", 0), write_text(tmp_path / "b.txt", 1, 5_000)
    args = [
        "--preset",
        "cpu-tiny",
        "--data",
        str(a),
        "--data",
        str(b),
        "--prepare-only",
        "--data-cache",
        str(tmp_path / "cache"),
    ]
    assert train_main(args) == 0
    out = capsys.readouterr().out
    assert f"Data: {a}" in out and f"Data: {b}" in out and out.count("Cache: ") == 2


@pytest.mark.parametrize(
    ("error", "says"),
    [
        ("GatedRepoError", "is gated; accept its terms"),
        ("RepositoryNotFoundError", "neither a local"),
    ],
)
def test_a_gated_or_missing_hub_dataset_is_one_line_exit_2(
    tmp_path, capsys, monkeypatch, error, says
):
    from types import SimpleNamespace

    import huggingface_hub
    from huggingface_hub import errors

    def refuse(repo_id, **kwargs):
        assert kwargs["repo_type"] == "dataset" and "*.parquet" in kwargs["allow_patterns"]
        response = SimpleNamespace(headers={}, request=None, status_code=403)
        raise getattr(errors, error)("refused", response=response)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    args = ["--preset", "cpu-tiny", "--data", "someone/private", "--out", str(tmp_path / "r")]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: data: ") and says in err and "\n" not in err
    assert not (tmp_path / "r").exists()


def test_the_model_card_names_every_source():
    from core.use.export import data_line

    cfg = tiny_config(data="a.jsonl", extra_data=["embedded"], data_weights="0.9,0.1")
    assert data_line(cfg) == "a.jsonl + embedded (weights 0.9,0.1)"
    assert data_line(tiny_config()).startswith("embedded corpus")
