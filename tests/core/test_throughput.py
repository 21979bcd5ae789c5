"""tokens_per_s measures training only; elapsed time includes everything."""

import statistics

from helpers import FakeTime, tiny_config

from core.runs.folder import read_metrics
from core.training import clock
from core.training.trainer import Trainer


def test_evaluation_time_is_not_counted_as_training_time(tmp_path, monkeypatch):
    cfg = tiny_config(max_steps=20, log_every=5, eval_every=5, ckpt_every=100)
    fake = FakeTime()
    monkeypatch.setattr(clock, "time", fake)
    Trainer(cfg, tmp_path / "plain").run()
    real = Trainer._record_eval  # the evaluation at an eval point (the objective's)

    def slow_evaluate(self, what):
        fake.now += 100.0  # a long evaluation, far longer than five tiny training steps
        return real(self, what)

    monkeypatch.setattr(Trainer, "_record_eval", slow_evaluate)
    Trainer(cfg, tmp_path / "slow").run()
    plain, _ = read_metrics(tmp_path / "plain" / "metrics.jsonl")
    slow, _ = read_metrics(tmp_path / "slow" / "metrics.jsonl")
    # windows after an evaluation (steps 6-10, 11-15, 16-20) would be ~1000x slower if counted
    after_eval = [r["tokens_per_s"] for r in slow if r["step"] > 5]
    baseline = statistics.median(r["tokens_per_s"] for r in plain)
    assert statistics.median(after_eval) > 0.5 * baseline
    assert slow[-1]["elapsed_s"] >= 300  # three slow evaluations before step 20's record
