"""The window's pretrained start: the model's info line, its shape fixed in the form, a
fine-tune run from the window, and a clear refusal of a folder that is not a model."""

from __future__ import annotations

import json

import pytest
from hf_models import TEXT, make_gemma3_multimodal, make_model
from test_gui_run import run_to_end, tiny_window

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pretrained") / "tiny-llama"
    make_model(folder, "llama")
    return folder


def test_pretrained_start_shows_the_model_and_fixes_its_shape(make_window, llama_folder, tmp_path):
    window = tiny_window(make_window, max_steps=6, eval_every=3, sample_tokens=4, seq_len=32)
    box = window.start_from
    assert box.new_button.isChecked() and not box.source.isEnabled()
    box.set_source(str(llama_folder))
    info = box.info.text()
    assert "llama" in info and "2 layers" in info and "width 32" in info
    assert "chat template: yes" in info
    form = window.form
    assert not form.widgets["hidden_dim"].isEnabled() and not form.widgets["tokenizer"].isEnabled()
    # the model decides its architecture: shown as it is, not editable
    assert not form.widgets["arch"].isEnabled() and not form.widgets["qk_norm"].isEnabled()
    # the greyed Architecture field names the model's family, not the arch of a new model
    assert form.widgets["arch"].currentText() == "" and info.startswith("Llama (llama), ")
    assert form.widgets["arch"].placeholderText() == "Llama"
    assert not form.widgets["qk_norm"].isChecked()
    cfg = form.validated()
    assert (cfg.init_from, cfg.tokenizer, cfg.hidden_dim, cfg.n_layers, cfg.arch) == (
        str(llama_folder),
        "model",
        32,
        2,
        "llama",
    )
    # the embedded corpus is offered as a second validation set: the plot shows forgetting
    assert cfg.eval_data == "embedded" and form.widgets["eval_data"].text() == "embedded"
    # auto lr: the fine-tuning default, LoRA's larger than full fine-tuning's
    from core.config import recipe

    form.set_values(lr=None, lora_rank=0)
    full = recipe.adamw_lr(form.validated())
    assert form.widgets["lr"].text() == f"auto ({full:.3g})" and full < 1e-3
    form.set_values(lora_rank=8)
    assert form.widgets["lr"].text() == f"auto ({recipe.adamw_lr(form.validated()):.3g})"
    assert recipe.adamw_lr(form.validated()) > full
    form.set_values(lora_rank=0)
    # a context longer than the model's is named, and Start waits for a fix
    form.set_values(seq_len=128)
    assert "longer than the pretrained model's context" in (form.error or "")
    assert "longer than" in form.field_error("seq_len")  # flagged by the error's field
    assert not window.start_button.isEnabled()
    form.set_values(seq_len=32)
    # thinking: a choice of the form, refused for this template, which has no switch
    form.widgets["thinking"].setCurrentText("on")
    assert form.config().thinking == "on" and not window.start_button.isEnabled()
    assert "thinking: on needs a chat template with a thinking switch" in form.field_error(
        "thinking"
    )
    form.set_values(thinking="default")
    assert form.widgets["thinking"].currentText() == "default" and window.start_button.isEnabled()
    # the MoE switches (Advanced) on a dense model: one line naming the field, Start waits;
    # picking the model again clears them
    form.set_values(lora_rank=8, lora_experts=True)
    assert "lora_experts:" in (form.error or "") and "dense model" in form.error
    assert not window.start_button.isEnabled()
    form.set_values(train_router=True)
    box.set_source(str(llama_folder))
    assert not form.widgets["lora_experts"].isChecked()
    assert not form.widgets["train_router"].isChecked() and window.start_button.isEnabled()


@pytest.mark.parametrize("family, shown", [("gemma2", "Gemma 2"), ("phi3", "Phi-3")])
def test_a_gemma_or_phi_start_shows_its_family_not_llama(make_window, tmp_path, family, shown):
    make_model(tmp_path / "model", family)
    window = tiny_window(make_window, seq_len=32)
    window.start_from.set_source(str(tmp_path / "model"))
    assert window.start_from.info.text().startswith(f"{shown} ({family}), ")
    arch = window.form.widgets["arch"]
    assert not arch.isEnabled() and arch.placeholderText() == shown and arch.currentText() == ""
    assert window.form.validated().arch == "llama"  # what the model runs as is unchanged
    window.start_from.set_source(None)  # back to a new model: the choice is the arch again
    assert arch.isEnabled() and arch.currentText() == "llama"
    assert window.form.validated().arch == "llama"


def test_pretrained_run_from_the_window(make_window, llama_folder, tmp_path, qtbot):
    window = tiny_window(make_window, max_steps=6, eval_every=3, sample_tokens=4, seq_len=32)
    window.start_from.set_source(str(llama_folder))
    data = tmp_path / "notes.txt"
    data.write_text(TEXT * 5, encoding="utf-8")
    window.form.set_values(data=str(data))
    window.out_edit.setText(str(tmp_path / "run"))
    result = run_to_end(qtbot, window, window.start)
    assert result["status"] == "finished" and result["step"] == 6
    evals = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r["step"] for r in evals if "val_loss" in r]
    assert steps == [0, 3, 6]  # step 0: the base model's own loss
    assert window.plots.curve_points("val_loss") == 3


def test_a_folder_that_is_not_a_model_is_refused_in_the_box(make_window, tmp_path):
    window = tiny_window(make_window)
    (tmp_path / "notes").mkdir()
    window.start_from.set_source(str(tmp_path / "notes"))
    assert "has no config.json" in window.start_from.info.text()
    assert not window.start_button.isEnabled()
    assert "config.json" in window.start_button.toolTip()
    window.start_from.new_button.setChecked(True)  # back to a new model: Start works again
    assert window.start_button.isEnabled()
    assert window.form.validated().init_from is None


def test_playground_chat_keeps_a_multi_turn_conversation(make_window, llama_folder, qtbot, dialogs):
    from core.data.chat import chat_ids
    from core.use.generate import generate_ids, stream_text
    from core.weights.loader import load

    window = make_window()
    pg = window.playground
    pg.run_combo.setEditText(str(llama_folder))  # a plain model folder, no run needed
    pg.temperature.setValue(0.0)
    pg.length.setValue(12)
    pg.chat.setChecked(True)
    loaded = load(llama_folder)
    tok = loaded.tokenizer
    messages, transcript = [], ""
    for turn in ("hello", "and then?"):
        pg.prompt.setPlainText(turn)
        with qtbot.waitSignal(pg.generation_done, timeout=30_000):
            assert pg.generate()
        assert pg.prompt.toPlainText() == ""  # ready for the next message
        messages.append({"role": "user", "content": turn})
        ids = chat_ids(tok, messages)  # the whole conversation so far, in its template
        new = generate_ids(loaded.model, ids, 12, temperature=0, stop_ids=tok.stop_ids)
        answer = "".join(stream_text(tok, new, hide=tok.stop_ids))
        messages.append({"role": "assistant", "content": answer})
        transcript += ("\n\n" if transcript else "") + f"You: {turn}\n\nModel: {answer}"
        assert pg.output.toPlainText() == transcript
    assert pg.history == messages and pg.status.text().startswith("Done")
    pg.new_chat_button.click()
    assert pg.history == [] and pg.output.toPlainText() == ""
    # a thinking choice for this chat: refused, as Llama's template has no switch
    pg.thinking.setCurrentText("on")
    pg.prompt.setPlainText("hello")
    with qtbot.waitSignal(pg.generation_done, timeout=30_000):
        assert pg.generate()
    assert "thinking: on needs a chat template with a thinking switch" in pg.status.text()
    assert dialogs.named("critical")


def test_lora_run_from_the_window_shows_trainable_of_total(
    make_window, llama_folder, tmp_path, qtbot
):
    window = tiny_window(make_window, max_steps=4, eval_every=2, sample_tokens=4, seq_len=32)
    window.start_from.set_source(str(llama_folder))
    data = tmp_path / "notes.txt"
    data.write_text(TEXT * 5, encoding="utf-8")
    window.form.set_values(data=str(data), lora_rank=4)
    assert "LoRA r4 + checkpointing" in window.estimate.label.text()
    result = run_to_end(qtbot, window, window.start)
    assert result["status"] == "finished"
    log = window.run_view.log_view.toPlainText()
    assert "LoRA rank 4 on all:" in log and "parameters train" in log


def test_fit_for_a_pretrained_start_on_a_simulated_gpu(make_window, llama_folder, monkeypatch):
    from test_gui import FAKE_8GB

    from core.platform import hardware
    from core.training import estimate as estimate_lib
    from core.training import planner

    monkeypatch.setattr(hardware, "gpus", lambda: [dict(FAKE_8GB)])
    window = make_window()
    window.start_from.set_source(str(llama_folder))  # the recommendation runs at once
    assert "full fine-tuning (AdamW) fits" in window.estimate.choice.text()
    assert window.form.validated().lora_rank == 0
    # a card too small for full fine-tuning even at batch 1, big enough for LoRA
    import dataclasses

    cfg = window.form.validated()
    one = dataclasses.replace(cfg, batch_size=1, grad_accum=1)
    full = estimate_lib.estimate(dataclasses.replace(one, lora_rank=0)).device_total
    low = estimate_lib.estimate(
        dataclasses.replace(one, lora_rank=16, grad_checkpointing=True)
    ).device_total
    assert low < full
    for module in (estimate_lib, planner):  # what fits, and the planner's own use of it
        monkeypatch.setattr(module, "usable_bytes", lambda free: (full + low) // 2)
    chosen = next(r for r in planner.walk_ladder(cfg, FAKE_8GB["free_bytes"]) if r.chosen)
    assert window.fit_to_gpu()
    cfg = window.form.validated()
    assert not chosen.name.startswith("full fine-tuning (AdamW) ")  # that one is too big
    for name in ("lora_rank", "grad_checkpointing", "optimizer", "base_bits", "batch_size"):
        assert getattr(cfg, name) == getattr(chosen.fitted, name), name
    assert chosen.name in window.estimate.choice.text()
    assert "◀ chosen" in window.estimate.choice.text()


def test_a_gemma3_multimodal_start_says_vision_kept_and_gets_a_fit(
    make_window, tmp_path, monkeypatch
):
    """A newer family in the window: the info line names it and says what is loaded, and
    the fit ladder answers from its config.json."""
    from test_gui import FAKE_8GB

    from core.platform import hardware

    monkeypatch.setattr(hardware, "gpus", lambda: [dict(FAKE_8GB)])
    make_gemma3_multimodal(tmp_path / "gemma3")
    window = make_window()
    window.start_from.set_source(str(tmp_path / "gemma3"))
    info = window.start_from.info.text()
    assert info.startswith("Gemma 3 (gemma3), ") and "6 layers" in info
    assert info.startswith("Gemma 3 (gemma3), vision kept, ") and "kept unchanged" in info
    assert "fits" in window.estimate.choice.text()
    assert window.form.validated().n_layers == 6
