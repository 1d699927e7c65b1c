"""Holt's linear exponential smoothing with change-point re-basing.

For observations x_t (any unit; one per planner interval):

    level_t = alpha * x_t + (1 - alpha) * (level_{t-1} + trend_{t-1})
    trend_t = beta * (level_t - level_{t-1}) + (1 - beta) * trend_{t-1}
    forecast of the next interval = max(floor, level_t + trend_t)

``beta = 0`` is a plain EWMA (no trend). The first observation sets the level, trend 0.

Change points: the one-step error e_t = x_t - forecast_{t-1} has a running noise estimate
``sigma`` (root of an EWMA, weight ``noise_weight``, of e^2 over the ordinary observations).
When |e_t| > max(change_z * sigma, change_rel * |forecast_{t-1}|) the series has moved to a new
level: smoothing over the step would take several intervals to catch up (with alpha = 0.5 the
forecast is still off by half the step after one interval, a quarter after two), so the level
re-bases on x_t with trend 0 and ``changed`` is set. ``change_rel`` keeps a series with no noise
so far (a constant prompt length) from re-basing on a small wiggle. No re-basing before
``warmup`` ordinary observations have given sigma something to stand on. A re-basing
observation adds its error to sigma's EWMA clipped at the threshold: a single step raises sigma
a little (it decays again with the ordinary observations), while a series that keeps "stepping"
back and forth (noisier than sigma said) raises it until its swings fall inside the threshold and
it is smoothed again, so noise cannot make the forecast follow every interval for long.
``change_z = 0`` turns re-basing off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class HoltForecaster:
    """One series' smoother; ``update(x)`` per interval, ``forecast()`` for the next one."""

    alpha: float = 0.5
    beta: float = 0.3
    floor: float = 0.0
    change_z: float = 4.0  # sigmas of one-step error that make a change point (0: never re-base)
    change_rel: float = 0.25  # and at least this fraction of the forecast
    noise_weight: float = 0.2  # EWMA weight of the squared one-step error
    warmup: int = 3  # ordinary observations (after the first) before a change point can be called
    level: float | None = None
    trend: float = 0.0
    count: int = 0
    noise_var: float = 0.0  # EWMA of squared one-step errors (unit^2)
    ordinary: int = 0  # observations folded in by smoothing (not the first, not re-basing ones)
    changed: bool = False  # the last observation was a change point (the level re-based on it)
    last_error: float = 0.0  # x_t - forecast_{t-1} of the last observation

    def __post_init__(self) -> None:
        if not (0 < self.alpha <= 1 and 0 <= self.beta <= 1):
            raise ValueError("need 0 < alpha <= 1 and 0 <= beta <= 1")
        if self.change_z < 0 or self.change_rel < 0 or not 0 < self.noise_weight <= 1:
            raise ValueError("need change_z >= 0, change_rel >= 0 and 0 < noise_weight <= 1")

    @property
    def sigma(self) -> float:
        """Running one-step error noise (the series' unit)."""
        return math.sqrt(self.noise_var)

    def threshold(self) -> float:
        """One-step error beyond which an observation is a change point (the series' unit; inf: none can be)."""
        f = self.forecast()
        if f is None or self.change_z == 0 or self.ordinary < self.warmup:
            return float("inf")
        return max(self.change_z * self.sigma, self.change_rel * abs(f))

    def is_change_point(self, x: float) -> bool:
        """Whether ``x`` is off the current forecast by more than its noise (see the module doc)."""
        f = self.forecast()
        return f is not None and abs(float(x) - f) > self.threshold()

    def update(self, x: float) -> None:
        """Fold one interval's observation in."""
        self.count += 1
        if self.level is None:
            self.level, self.changed, self.last_error = float(x), False, 0.0
            return
        f = self.forecast()
        assert f is not None
        self.last_error = float(x) - f
        limit = self.threshold()
        if abs(self.last_error) > limit:
            self.noise_var = (1 - self.noise_weight) * self.noise_var + self.noise_weight * limit ** 2
            self.level, self.trend, self.changed = float(x), 0.0, True
            return
        self.changed = False
        self.ordinary += 1
        self.noise_var = (1 - self.noise_weight) * self.noise_var + self.noise_weight * self.last_error ** 2
        prev = self.level
        self.level = self.alpha * float(x) + (1 - self.alpha) * (prev + self.trend)
        self.trend = self.beta * (self.level - prev) + (1 - self.beta) * self.trend

    def forecast(self) -> float | None:
        """Expected value over the next interval (None before the first observation)."""
        if self.level is None:
            return None
        return max(self.floor, self.level + self.trend)
