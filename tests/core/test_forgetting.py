"""The second validation set (--eval-data): scored at every evaluation point, written to
metrics.jsonl and plotted; with the default fine-tuning settings a model learns a new text
without forgetting the one it was trained on."""

from __future__ import annotations

import pytest
from helpers import tiny_config

from core.cli.train import main as train_main
from core.runs.folder import read_metrics
from core.training.trainer import Trainer
from core.use.export import export

CODE = "def add(a, b):\n    return a + b\n\nclass Box:\n    def __init__(self):\n        pass\n"
PROSE = "The river ran past the old mill, and the miller's daughter sang to the geese.\n"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A small model trained on code, exported as a Hugging Face folder to fine-tune."""
    root = tmp_path_factory.mktemp("forgetting")
    (root / "code.txt").write_text(CODE * 400, encoding="utf-8")
    (root / "prose.txt").write_text(PROSE * 400, encoding="utf-8")
    cfg = tiny_config(
        data=str(root / "code.txt"),
        hidden_dim=64,
        n_heads=4,
        max_steps=150,
        eval_every=150,
        ckpt_every=150,
        dropout=0.0,
        sample_tokens=0,
    )
    Trainer(cfg, root / "run").run()
    return root, export(root / "run", "hf", root / "hf", log=lambda m: None)


def fine_tune(root, hf, out, **kw):
    values = dict(
        init_from=str(hf),
        tokenizer="model",
        data=str(root / "prose.txt"),
        eval_data=str(root / "code.txt"),
        lr=None,
        warmup_steps=20,
        hidden_dim=64,
        n_heads=4,
        max_steps=30,
        eval_every=10,
        dropout=0.0,
        sample_tokens=0,
    )
    cfg = tiny_config(**{**values, **kw})
    Trainer(cfg, out).run()
    return read_metrics(out / "metrics.jsonl")[1]


def test_the_second_validation_set_is_scored_at_every_evaluation(base, tmp_path):
    root, hf = base
    evals = fine_tune(root, hf, tmp_path / "ft")
    assert [e["step"] for e in evals] == [0, 10, 20, 30]  # step 0: the base model itself
    assert all(e["eval_data_loss"] > 0 and e["eval_data_bpb"] > 0 for e in evals)


def test_default_fine_tuning_learns_the_new_text_and_keeps_the_old(base, tmp_path):
    """Margin: the code loss may rise by at most 0.05 nats (about 2%) in 30 default steps,
    while the prose loss must fall clearly; with the old default lr (1e-3) it rose by far more."""
    root, hf = base
    evals = fine_tune(root, hf, tmp_path / "default")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.2
    assert evals[-1]["eval_data_loss"] - evals[0]["eval_data_loss"] < 0.05
    old = fine_tune(root, hf, tmp_path / "old-default", lr=1e-3)
    assert old[-1]["eval_data_loss"] - old[0]["eval_data_loss"] > 0.05


def test_a_missing_second_validation_set_is_one_line_before_anything(tmp_path, capsys):
    args = [
        "--preset",
        "cpu-tiny",
        "--max-steps",
        "2",
        "--eval-data",
        str(tmp_path / "nope"),
        "--out",
        str(tmp_path / "run"),
        "--data-cache",
        str(tmp_path / "c"),
    ]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: eval_data:") and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_the_plot_draws_the_second_validation_curve(qtbot):
    from gui.plots import PlotPanel

    panel = PlotPanel()
    qtbot.addWidget(panel)
    panel.add_eval({"step": 0, "val_loss": 3.0, "val_bpb": 1.0, "eval_data_loss": 2.5})
    panel.add_eval({"step": 10, "val_loss": 2.0, "val_bpb": 0.8, "eval_data_loss": 2.6})
    assert panel.series["eval_data_loss"].size == 2
    assert panel.specs["eval_data_loss"].plot == "loss"
