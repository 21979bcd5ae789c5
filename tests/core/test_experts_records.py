"""A mixture of experts' step records read back (core.runs.experts, Compare): the latest load
strip, the experts that got no token, the routing curves; dense runs carry none of it."""

from __future__ import annotations

from test_compare import write_metrics

from core.runs import experts
from core.runs.compare import MEASURES, run_curves, run_summary


def moe_record(step: int, load: list[list[float]], layers=None, entropy=1.5, aux=2.0) -> dict:
    return {
        "step": step,
        "loss": 3.0 - 0.1 * step,
        "elapsed_s": float(step),
        experts.AUX: aux,
        experts.ENTROPY: entropy,
        experts.LOAD: load,
        experts.LAYERS: layers if layers is not None else list(range(len(load))),
    }


EVEN = [0.25, 0.25, 0.25, 0.25]


def test_idle_experts_are_named_by_layer():
    load = experts.from_record(moe_record(7, [EVEN, [0.5, 0.0, 0.5, 0.0], EVEN], layers=[1, 3, 5]))
    assert load.step == 7 and load.layers == (1, 3, 5) and load.n_experts == 4
    assert load.idle() == {3: [1, 3]}
    assert load.idle_line() == "2 experts idle in layer 3"
    several = experts.from_record(moe_record(8, [[1.0, 0.0], [0.0, 1.0]], layers=[0, 2]))
    assert several.idle() == {0: [1], 2: [0]}
    assert several.idle_line() == "2 experts idle in 2 layers"
    one = experts.from_record(moe_record(9, [[1.0, 0.0]]))
    assert one.idle_line() == "1 expert idle in layer 0"
    assert experts.from_record(moe_record(9, [EVEN])).idle_line() == "no idle experts"


def test_dense_or_malformed_records_have_no_load():
    assert experts.from_record({"step": 1, "loss": 2.0}) is None
    assert experts.from_record({"step": 1, experts.LOAD: []}) is None
    assert experts.from_record({"step": 1, experts.LOAD: [[0.5, "x"]]}) is None
    assert experts.from_record({"step": 1, experts.LOAD: [0.5, 0.5]}) is None
    # layers missing or of another length: the rows' order stands in
    assert experts.from_record(
        {"step": 1, experts.LOAD: [EVEN], experts.LAYERS: [1, 2]}
    ).layers == (0,)


def test_the_latest_load_is_the_last_record_that_has_one(tmp_path):
    records = [
        moe_record(1, [[0.7, 0.3]]),
        moe_record(2, [[0.6, 0.4]]),
        {"step": 2, "val_loss": 2.5},
        {"step": 3, "loss": 2.0},  # a record without routing (none is lost over it)
    ]
    write_metrics(tmp_path / "m", records)
    load = experts.run_load(tmp_path / "m")
    assert load.step == 2 and load.shares == ((0.6, 0.4),)
    write_metrics(tmp_path / "d", [{"step": 1, "loss": 3.0}])
    assert experts.run_load(tmp_path / "d") is None


def test_compare_draws_routing_curves_and_summarizes_idle_experts(tmp_path):
    records = [
        moe_record(1, [EVEN, EVEN], entropy=1.38, aux=2.0),
        moe_record(2, [EVEN, [0.5, 0.5, 0.0, 0.0]], entropy=1.2, aux=2.4),
        {"step": 2, "val_loss": 2.5},
    ]
    write_metrics(tmp_path / "m", records)
    entropy = run_curves(tmp_path / "m", "router entropy (MoE)")
    assert entropy["train"] == [(1, 1.0, 1.38), (2, 2.0, 1.2)] and entropy["val"] == []
    assert [v for *_, v in run_curves(tmp_path / "m", "aux loss (MoE)")["train"]] == [2.0, 2.4]
    summary = run_summary(tmp_path / "m")
    assert summary["router entropy"] == 1.2 and summary["idle experts"] == 2
    assert summary["val_loss"] == 2.5
    # a dense run has nothing to draw or summarize for them
    write_metrics(tmp_path / "d", [{"step": 1, "loss": 3.0}, {"step": 1, "val_loss": 3.1}])
    assert run_curves(tmp_path / "d", "aux loss (MoE)")["train"] == []
    assert run_summary(tmp_path / "d") == {"val_loss": 3.1, "best val_loss": 3.1}
    assert "loss" in MEASURES and list(MEASURES)[0] == "loss"
