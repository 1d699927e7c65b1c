"""Holt's linear exponential smoothing: an EWMA of the level plus an EWMA of its trend.

For observations x_t (any unit; one per planner interval):

    level_t = alpha * x_t + (1 - alpha) * (level_{t-1} + trend_{t-1})
    trend_t = beta * (level_t - level_{t-1}) + (1 - beta) * trend_{t-1}
    forecast of the next interval = max(floor, level_t + trend_t)

``beta = 0`` is a plain EWMA (no trend). The first observation sets the level, trend 0.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class HoltForecaster:
    """One series' smoother; ``update(x)`` per interval, ``forecast()`` for the next one."""

    alpha: float = 0.5
    beta: float = 0.3
    floor: float = 0.0
    level: float | None = None
    trend: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not (0 < self.alpha <= 1 and 0 <= self.beta <= 1):
            raise ValueError("need 0 < alpha <= 1 and 0 <= beta <= 1")

    def update(self, x: float) -> None:
        """Fold one interval's observation in."""
        self.count += 1
        if self.level is None:
            self.level = float(x)
            return
        prev = self.level
        self.level = self.alpha * float(x) + (1 - self.alpha) * (prev + self.trend)
        self.trend = self.beta * (self.level - prev) + (1 - self.beta) * self.trend

    def forecast(self) -> float | None:
        """Expected value over the next interval (None before the first observation)."""
        if self.level is None:
            return None
        return max(self.floor, self.level + self.trend)
