"""The `balance evaluate` chart: panels of lines per policy over the replayed windows, as a PNG.

Drawn with matplotlib's object-oriented API (:class:`matplotlib.figure.Figure`, saved through its Agg
canvas): no pyplot, no global state, no display, so it works in a headless pod or over SSH. Each panel
has its title, an x axis of replay windows and a y axis with its quantity's name, tick values on both,
and a legend naming the policies; the image alone is readable. matplotlib is imported only when a chart
is drawn, so the balancing daemon and the other commands do not pay for it at start-up.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ascend_runtime.files.write import write_file

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Width and height of one panel, inches (at :data:`DPI`: 900 x 300 pixels).
PANEL_SIZE_IN = (9.0, 3.0)
DPI = 100


@dataclass(frozen=True)
class Panel:
    """One panel: its title, the y axis's quantity and one series of values per policy (x: replay window)."""

    title: str
    ylabel: str
    series: dict[str, list[float]]


def figure(panels: list[Panel], xlabel: str = "replay window") -> Figure:
    """The panels stacked vertically, each titled, with labelled axes, tick values and a legend.

    A policy keeps its colour in every panel; a non-finite value is a gap; a series of one value is a marker."""
    from matplotlib.figure import Figure  # noqa: PLC0415 - imported only to draw

    if not panels:
        raise ValueError("no panels to draw")
    width, height = PANEL_SIZE_IN
    fig = Figure(figsize=(width, height * len(panels)), dpi=DPI, layout="constrained")
    names = list(dict.fromkeys(name for p in panels for name in p.series))
    colours = {name: f"C{i % 10}" for i, name in enumerate(names)}
    for ax, panel in zip(fig.subplots(len(panels), 1, squeeze=False)[:, 0], panels):
        for name, values in panel.series.items():
            ax.plot(range(len(values)), [float(v) for v in values], label=name, color=colours[name],
                    marker="o" if len(values) == 1 else None, linewidth=1.5)
        ax.set_title(panel.title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.xaxis.get_major_locator().set_params(integer=True)  # windows are whole numbers
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small", title="policy", title_fontsize="small")
    return fig


def line_chart(path: str | Path, panels: list[Panel]) -> list[str]:
    """Write :func:`figure` of ``panels`` to ``path`` as a PNG; returns the panel titles.

    The titles and the policies are also in the PNG's ``Title`` and ``Description`` text chunks."""
    titles = [p.title for p in panels]
    names = list(dict.fromkeys(name for p in panels for name in p.series))
    png = io.BytesIO()
    figure(panels).savefig(png, format="png", metadata={
        "Title": "; ".join(titles), "Description": f"one line per policy ({', '.join(names)}); x: replay window"})
    write_file(Path(path), png.getvalue())  # temporary file and rename: a link at the name is replaced, not followed
    return titles
