"""A minimal PNG line-chart writer (numpy + zlib): panels of polylines on a white canvas.

The kit imports nothing at run time that is not a declared dependency, and a plotting
library is far heavier than one diagnostic chart needs; so charts are rasterised here.
Text is not drawn: titles, axis ranges and the colour legend go into PNG ``tEXt`` chunks
(shown by image viewers' "properties") and are printed by the caller.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

#: distinct colours (RGB) for series, in order
PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75), (0, 0, 0)]


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(rgb: np.ndarray, text: dict[str, str] | None = None) -> bytes:
    """``rgb [H, W, 3]`` uint8 -> PNG bytes (8-bit RGB, no filtering), with ``tEXt`` chunks."""
    h, w, _ = rgb.shape
    raw = np.concatenate([np.zeros((h, 1), dtype=np.uint8), rgb.reshape(h, w * 3)], axis=1).tobytes()
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    for k, v in (text or {}).items():
        out += _chunk(b"tEXt", k.encode("latin-1", "replace")[:79] + b"\0" + v.encode("latin-1", "replace"))
    return out + _chunk(b"IDAT", zlib.compress(raw, 6)) + _chunk(b"IEND", b"")


def _line(img: np.ndarray, x0: float, y0: float, x1: float, y1: float, colour: tuple[int, int, int]) -> None:
    n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    xs = np.linspace(x0, x1, n).round().astype(int)
    ys = np.linspace(y0, y1, n).round().astype(int)
    for dx, dy in ((0, 0), (1, 0), (0, 1)):  # 2 px wide
        ok = (xs + dx < img.shape[1]) & (ys + dy < img.shape[0]) & (xs >= 0) & (ys >= 0)
        img[ys[ok] + dy, xs[ok] + dx] = colour


def line_chart(path: str | Path, panels: list[tuple[str, dict[str, list[float]]]], width: int = 900,
               panel_height: int = 260) -> dict[str, str]:
    """Write panels (title, {series name: y values}) stacked vertically; returns the legend text.

    Each panel has its own y range (printed in the legend text); x is the value's index."""
    margin = 30
    img = np.full((panel_height * len(panels), width, 3), 255, dtype=np.uint8)
    text: dict[str, str] = {}
    names = list(dict.fromkeys(n for _, series in panels for n in series))
    colours = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    for p, (title, series) in enumerate(panels):
        top, bottom = p * panel_height + margin // 2, (p + 1) * panel_height - margin // 2
        left, right = margin, width - margin // 2
        img[top:bottom, left] = img[bottom, left:right] = (128, 128, 128)  # axes
        values = [v for ys in series.values() for v in ys if np.isfinite(v)]
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        if hi - lo < 1e-12:
            lo, hi = lo - 0.5, hi + 0.5
        n = max((len(ys) for ys in series.values()), default=1)
        for name, ys in series.items():
            pts = [(left + (right - left) * i / max(n - 1, 1), bottom - (bottom - top) * (y - lo) / (hi - lo))
                   for i, y in enumerate(ys) if np.isfinite(y)]
            for (xa, ya), (xb, yb) in zip(pts, pts[1:]):
                _line(img, xa, ya, xb, yb, colours[name])
            if len(pts) == 1:
                _line(img, pts[0][0] - 3, pts[0][1], pts[0][0] + 3, pts[0][1], colours[name])
        text[f"Panel {p + 1}"] = f"{title}; y from {lo:.4g} (bottom) to {hi:.4g} (top); x = replay window"
    text["Legend"] = ", ".join(f"{n}=rgb{colours[n]}" for n in names)
    Path(path).write_bytes(encode_png(img, text))
    return text
