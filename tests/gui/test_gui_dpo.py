"""DPO from the window: preference data picked in the form switches the method to DPO, the
run trains, and the preference plot (rewards, margins, accuracy) appears beside the loss."""

from __future__ import annotations

import json

import pytest
from hf_models import make_model
from test_gui_run import run_to_end, tiny_window

pytest.importorskip("transformers")


def test_preference_data_offers_dpo_and_its_run_plots_the_signals(make_window, tmp_path, qtbot):
    make_model(tmp_path / "model", "qwen2")
    rows = [
        {
            "prompt": f"Add {i} and {i + 1}.",
            "chosen": f"{2 * i + 1}. Done!",
            "rejected": f"{2 * i + 1}. Hmm?",
        }
        for i in range(24)
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    window = tiny_window(make_window, max_steps=4, eval_every=2, sample_tokens=0, seq_len=48)
    window.start_from.set_source(str(tmp_path / "model"))
    form = window.form
    assert form.widgets["method"].currentText() == "sft"
    form.set_values(data=str(data), lora_rank=4)
    assert form.widgets["method"].currentText() == "dpo"
    assert "24 pairs" in form.data_info.text() and "DPO" in form.data_info.text()
    assert window.plots.plots["preference"].isHidden()
    window.out_edit.setText(str(tmp_path / "run"))
    result = run_to_end(qtbot, window, window.start)
    assert result["status"] == "finished" and result["step"] == 4
    window.plots.redraw()
    assert not window.plots.plots["preference"].isHidden()
    assert window.plots.curve_points("rewards/margins") == 4
    assert window.plots.curve_points("eval_rewards/accuracies") == 3  # steps 0, 2, 4
    window.plots.grab()  # a real paint of the preference plot


def test_a_finished_run_is_a_start_model(make_window, tmp_path, gui_env):
    from core.cli.train import main as train_main

    make_model(tmp_path / "model", "qwen2")
    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        "".join(json.dumps({"prompt": f"Q{i}", "completion": f"A{i}"}) + "\n" for i in range(8)),
        encoding="utf-8",
    )
    argv = [
        "--init-from",
        str(tmp_path / "model"),
        "--data",
        str(chat),
        "--max-steps",
        "2",
        "--lora-rank",
        "4",
        "--sample-tokens",
        "0",
        "--out",
        str(tmp_path / "sft"),
    ]
    assert train_main(argv) == 0
    window = tiny_window(make_window, max_steps=2)
    window.start_from.set_source(str(tmp_path / "sft"))
    assert window.start_from.error is None
    assert "the finished run" in window.start_from.info.text()
    init_from = window.form.validated().init_from
    assert (tmp_path / "sft").name in init_from and init_from.endswith(
        window.start_from.pretrained.name.rsplit("/", 1)[-1]
    )
