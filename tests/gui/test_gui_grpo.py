"""GRPO from the window: method grpo shows its box (rewards, G, completion length), a reward
file that does not import is flagged before Start, and a run plots its rewards and fills the
table of sampled completions."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_models import make_model
from test_gui_run import run_to_end, tiny_window

pytest.importorskip("transformers")

ARITHMETIC = Path(__file__).parent.parent / "fixtures" / "arithmetic.jsonl"


def test_a_grpo_run_from_the_window_plots_rewards_and_shows_completions(
    make_window, tmp_path, qtbot
):
    make_model(tmp_path / "model", "qwen2")
    window = tiny_window(make_window, max_steps=3, eval_every=3, sample_tokens=0, seq_len=64)
    window.start_from.set_source(str(tmp_path / "model"))
    form = window.form
    form.set_values(data=str(ARITHMETIC))
    assert form.boxes["GRPO: rewards and sampling"].isHidden()
    form.widgets["method"].setCurrentText("grpo")
    assert not form.boxes["GRPO: rewards and sampling"].isHidden()
    assert "64 prompts (conversational) for GRPO; columns for the rewards: answer" in (
        form.data_info.text()
    )
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module\n")
    form.set_values(
        reward=[f"{broken}:f"], num_generations=4, max_completion_tokens=6, batch_size=2
    )
    assert form.widgets["method"].currentText() == "grpo"
    assert "failed to import" in form.check() and form.field_error("reward")
    good = tmp_path / "rewards.py"
    good.write_text(
        "def digits(completions, **kw):\n"
        "    return [float(any(ch.isdigit() for ch in c[0]['content']))"
        " for c in completions]\n"
    )
    form.widgets["reward"].setText(f"think_format, {good}:digits")
    assert form.check() is None, form.error
    assert form.validated().reward == ["think_format", f"{good}:digits"]
    window.out_edit.setText(str(tmp_path / "run"))
    result = run_to_end(qtbot, window, window.start)
    assert result["status"] == "finished" and result["step"] == 3, result
    window.plots.redraw()
    assert not window.plots.plots["rewards"].isHidden()
    assert window.plots.curve_points("reward") == 3
    assert window.plots.curve_points("eval_reward") == 2  # steps 0 and 3
    table = window.run_view.completions.table
    assert table.rowCount() == 2 * 4
    headers = [table.horizontalHeaderItem(i).text() for i in range(table.columnCount())]
    assert headers[:4] == ["prompt", "completion", "reward", "advantage"]
    assert {"think_format", "digits"} <= set(headers)
    assert "What is" in table.item(0, 0).text()
    # Resume refills the plots from metrics.jsonl: the held-out reward is history too.
    window.run_view._refill_plots(tmp_path / "run", 3)
    window.plots.redraw()
    assert window.plots.curve_points("eval_reward") == 2
    # Compare shows a GRPO run by its reward (its policy loss says little), and its table
    # the held-out reward.
    compare = window.run_view.compare
    compare.tick(tmp_path / "run")
    assert compare.measure.currentText() == "reward"
    items = compare.plot.getPlotItem().listDataItems()
    assert [len(item.getData()[0]) for item in items] == [3, 2]  # training, held-out
    assert "held-out" in items[1].name() and "grpo" in items[1].name()
    headers = [
        compare.table.horizontalHeaderItem(i).text() for i in range(compare.table.columnCount())
    ]
    assert headers[:2] == ["eval_reward", "best eval_reward"]
