"""The profiler timeline figure: one row per rank, one box per range, coloured by kind, the
rank's communication share (from summarize) in its label."""
import pytest

from reference_impl.figures.trace_timeline import plot_trace, range_category


def complete(name, pid, ts, dur):
    return {"name": name, "ph": "X", "cat": "user_annotation", "pid": pid, "tid": 0,
            "ts": ts, "dur": dur}


EVENTS = [
    complete("attn forward", 0, 0, 100), complete("all_reduce", 0, 60, 40),
    complete("mlp backward", 0, 100, 100),
    complete("stage 1 mb 0 block0 forward", 1, 50, 50),
    complete("batch_isend_irecv", 1, 0, 50), complete("batch_isend_irecv wait", 1, 10, 40),
    complete("aten::mm", 1, 0, 5),  # the profiler's own op: not a range, not drawn
]


def test_one_row_per_rank_one_box_per_range():
    figure = plot_trace(EVENTS, title="synthetic")
    axes = figure.axes[0]
    kinds = [patch.get_gid() for patch in axes.patches]
    assert sorted(kinds) == sorted(["forward", "comm", "backward", "forward", "comm", "wait"])
    labels = [label.get_text() for label in axes.get_yticklabels()]
    assert labels == ["rank 0\ncomm 20%", "rank 1\ncomm 50%"]
    assert axes.get_xlim() == pytest.approx((0, 0.2))  # 200 us, in ms


def test_categories_and_an_empty_trace():
    assert [range_category(name) for name in ("ln1 forward", "attn backward", "all_gather",
                                              "irecv wait")] == [
        "forward", "backward", "comm", "wait"]
    with pytest.raises(ValueError, match="no ranges of profiled"):
        plot_trace([complete("aten::mm", 0, 0, 5)])
