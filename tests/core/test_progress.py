"""The window's progress line: elapsed time and ETA arithmetic, without Qt."""

from core.runs.progress import Progress, describe_run_data, fmt_duration


def batch(step, elapsed, loss=2.0, tps=1000.0):
    return {"step": step, "loss": loss, "tokens_per_s": tps, "elapsed_s": elapsed}


def test_eta_uses_this_sessions_rate_not_the_resumed_history():
    p = Progress()
    p.start(max_steps=1000, start_step=500)  # resumed at 500; the first 500 took hours
    p.add_batch(batch(510, elapsed=7200.0), now=100.0)
    p.add_batch(batch(610, elapsed=7210.0), now=110.0)  # 100 steps in 10 s
    assert p.eta(running=True) == 39.0  # 390 steps at 10 steps/s
    assert p.elapsed(now=112.5, running=True) == 7212.5  # ticks on between records
    assert p.elapsed(now=112.5, running=False) == 7210.0
    assert p.eta(running=False) == 0.0


def test_summary_reads_like_the_status_line():
    p = Progress()
    assert p.summary(0.0, True) == "" and p.eta(True) is None
    p.start(100, 0)
    p.add_batch(batch(10, elapsed=5.0, loss=1.23456, tps=12345.6), now=1.0)
    assert p.eta(True) is None  # one record: no rate yet
    p.add_eval({"step": 10, "val_loss": 1.5})
    p.add_batch(batch(20, elapsed=10.0), now=6.0)
    text = p.summary(now=6.0, running=True)
    assert text == "loss 2.0000    val 1.5000    1,000 tok/s    elapsed 0:00:10    ETA 0:00:40"
    p.reset()
    assert p.last is None and p.summary(0.0, True) == ""


def test_a_grpo_run_shows_its_held_out_reward_as_a_reward():
    p = Progress()
    p.start(100, 0)
    p.add_batch(batch(10, elapsed=5.0), now=1.0)
    p.add_eval({"step": 10, "eval_reward": 0.625})  # GRPO's evaluation: no val_loss
    text = p.summary(now=1.0, running=True)
    assert text == "loss 2.0000    eval reward 0.6250    1,000 tok/s    elapsed 0:00:05    ETA —"


def test_durations_and_the_data_line():
    assert fmt_duration(None) == "—" and fmt_duration(3725.9) == "1:02:05"
    info = {
        "max_steps": 100,
        "start_step": 0,
        "tokens_per_step": 1000,
        "data": {
            "source": "corpus.txt",
            "source_bytes": 2_000_000,
            "total_bytes": 4_000_000,
            "train_tokens": 40_000,
            "val_tokens": 2_000,
            "tokenizer": "bpe",
        },
    }
    line = describe_run_data(info)
    assert line.startswith("corpus.txt, using 2.0 of 4.0 MB, 42,000 tokens (bpe), 2.50 passes")
    assert describe_run_data({"data_source": "embedded"}) == "embedded"
