"""The `balance evaluate` chart: titled panels, labelled axes with values, a legend, in the PNG itself."""

from __future__ import annotations

import numpy as np
import pytest

from ascend_runtime.balancer.png import Panel, figure, line_chart

PANELS = [
    Panel("decode: balancedness (next window)", "balancedness", {"none": [0.41, 0.40, 0.43], "greedy": [0.82, 0.85, 0.8]}),
    Panel("decode: MoE ms per step incl. moves", "MoE ms per step", {"none": [9.1, 9.4, 9.0], "greedy": [5.2, 5.0, 5.6]}),
]


def _dark_pixels(path) -> int:
    from matplotlib.image import imread

    rgb = imread(str(path))[..., :3]
    return int((rgb.mean(axis=2) < 0.5).sum())


def test_every_panel_has_a_title_labelled_axes_with_values_and_a_legend() -> None:
    fig = figure(PANELS)
    fig.canvas.draw()  # tick labels get their text when drawn
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == [p.title for p in PANELS]
    for ax, panel in zip(axes, PANELS):
        assert ax.get_xlabel() == "replay window" and ax.get_ylabel() == panel.ylabel
        for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
            values = [t.get_text() for t in ticks if t.get_text()]
            assert len(values) >= 2, (panel.title, values)
        legend = ax.get_legend()
        assert legend is not None and [t.get_text() for t in legend.get_texts()] == list(panel.series)
        assert [line.get_label() for line in ax.get_lines()] == list(panel.series)


def test_the_png_carries_the_text(tmp_path) -> None:
    """The written PNG against the same figure with every title, label, tick value and legend removed."""
    annotated = tmp_path / "chart.png"
    line_chart(annotated, PANELS)
    bare = figure(PANELS)
    for ax in bare.get_axes():
        ax.set_title("")
        ax.set_xlabel("")
        ax.set_ylabel("")
        ax.get_legend().remove()
        ax.set_xticks([])
        ax.set_yticks([])
    bare.savefig(tmp_path / "bare.png")
    assert annotated.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _dark_pixels(annotated) > _dark_pixels(tmp_path / "bare.png") + 2000  # text is thousands of dark pixels


def test_missing_values_are_gaps_and_a_single_window_is_a_point(tmp_path) -> None:
    panels = [Panel("one window", "ms", {"a": [1.0]}), Panel("gaps", "ms", {"a": [1.0, float("nan"), 2.0]})]
    line_chart(tmp_path / "c.png", panels)
    one = figure(panels).get_axes()[0].get_lines()[0]
    assert one.get_marker() not in (None, "None", "")  # a lone value is drawn as a marker
    assert np.isnan(figure(panels).get_axes()[1].get_lines()[0].get_ydata()).sum() == 1
    with pytest.raises(ValueError):
        line_chart(tmp_path / "none.png", [])


def test_balance_evaluate_writes_the_titled_chart(tmp_path, capsys, monkeypatch) -> None:
    """The figure the command saves: a titled panel per stage and quantity, labelled axes, a policy legend."""
    from ascend_runtime.balancer import png
    from ascend_runtime.balancer.trace import synthetic_trace
    from ascend_runtime.cli import main

    drawn = []
    monkeypatch.setattr(png, "figure", lambda panels, **kw: drawn.append(figure(panels, **kw)) or drawn[-1])
    load = tmp_path / "load.npy"
    np.save(load, synthetic_trace(4, layers=2, experts=16, seed=3))
    plot = tmp_path / "evaluate.png"
    rc = main(["balance", "evaluate", "--load-dir", str(load), "--ranks", "4", "--interval", "1",
               "--policy", "none", "--policy", "greedy", "--plot", str(plot)])
    out = capsys.readouterr().out
    assert rc == 0, out
    (fig,) = drawn
    titles = [ax.get_title() for ax in fig.get_axes()]
    assert titles == ["stage: balancedness on the next window (1 = even)", "stage: MoE time per step, moves included"]
    assert [ax.get_ylabel() for ax in fig.get_axes()] == ["balancedness", "MoE ms per step"]
    assert all([t.get_text() for t in ax.get_legend().get_texts()] == ["none", "greedy"] for ax in fig.get_axes())
    from matplotlib.image import imread

    assert imread(str(plot)).shape[:2] == (600, 900) and titles[0] in out
