"""Live instance state and load-aware selection (prefill and decode pools).

All methods are synchronous and called from the event loop thread only, so no
locks are needed. Loads are counters kept by the proxy itself (outstanding
prompt tokens, active decode streams) refined by gauges scraped from each
instance's ``/metrics`` (``vllm:kv_cache_usage_perc``,
``vllm:num_requests_waiting``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ascend_runtime.proxy.config import RoutingWeights
from ascend_runtime.proxy.instances import ROLES, InstanceSpec, Role


@dataclass(slots=True)
class InstanceState:
    """Runtime state of one instance. Times are ``time.monotonic()`` seconds."""

    spec: InstanceSpec
    source: str = "static"
    outstanding_prompt_tokens: int = 0
    active_seqs: int = 0
    inflight: int = 0
    kv_usage: float | None = None
    waiting: float | None = None
    healthy: bool = True
    health_reason: str = "not checked yet"
    consecutive_failures: int = 0
    ejected_until: float = 0.0
    eject_reason: str = ""
    draining: bool = False
    removed: bool = False
    served: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def role(self) -> Role:
        return self.spec.role

    def routable(self, now: float) -> bool:
        """True if new requests may be sent here."""
        return self.healthy and not self.draining and not self.removed and now >= self.ejected_until

    def why_not_routable(self, now: float) -> str:
        """Human-readable reason this instance is skipped ('' if routable)."""
        if self.removed:
            return "removed"
        if self.draining:
            return "draining"
        if now < self.ejected_until:
            return f"ejected for {self.ejected_until - now:.1f}s more ({self.eject_reason})"
        if not self.healthy:
            return f"unhealthy ({self.health_reason})"
        return ""

    def snapshot(self, now: float) -> dict[str, Any]:
        """JSON-ready view for ``GET /admin/instances`` and ``/health``."""
        return {
            **self.spec.to_dict(),
            "source": self.source,
            "routable": self.routable(now),
            "status": self.why_not_routable(now) or "ok",
            "healthy": self.healthy,
            "draining": self.draining,
            "inflight": self.inflight,
            "outstanding_prompt_tokens": self.outstanding_prompt_tokens,
            "active_seqs": self.active_seqs,
            "kv_cache_usage": self.kv_usage,
            "num_requests_waiting": self.waiting,
            "consecutive_failures": self.consecutive_failures,
            "served": self.served,
        }


class NoInstanceError(Exception):
    """No routable instance of a role; ``str()`` says why, instance by instance."""

    def __init__(self, role: Role, reasons: dict[str, str]):
        self.role = role
        self.reasons = reasons
        detail = "; ".join(f"{n}: {r}" for n, r in sorted(reasons.items())) or "none configured"
        super().__init__(f"no available {role} instance ({detail})")


EventHook = Callable[[str, InstanceState, str], None]


@dataclass
class InstancePool:
    """All known instances of both roles, with selection and passive health.

    ``on_event(kind, state, reason)`` is called for ``eject``, ``readmit``,
    ``add``, ``remove``; the metrics module hooks in there.
    """

    weights: RoutingWeights = field(default_factory=RoutingWeights)
    eject_after: int = 3
    eject_duration_s: float = 5.0
    on_event: EventHook | None = None
    clock: Callable[[], float] = time.monotonic
    _by_name: dict[str, InstanceState] = field(default_factory=dict)
    _rr: itertools.count = field(default_factory=itertools.count)

    # ---- membership -------------------------------------------------------------
    def get(self, name: str) -> InstanceState | None:
        return self._by_name.get(name)

    def all(self, role: Role | None = None) -> list[InstanceState]:
        return [s for s in self._by_name.values() if role is None or s.role == role]

    def add(self, spec: InstanceSpec, source: str = "static") -> InstanceState:
        """Add ``spec`` or update the instance of that name (keeps its counters)."""
        state = self._by_name.get(spec.name)
        if state is not None:
            state.spec, state.source = spec, source
            state.removed = state.draining = False
            return state
        state = InstanceState(spec=spec, source=source)
        self._by_name[spec.name] = state
        self._emit("add", state, source)
        return state

    def remove(self, name: str) -> bool:
        """Stop routing to ``name``; forget it once its in-flight requests finish."""
        state = self._by_name.get(name)
        if state is None:
            return False
        state.removed = True
        self._reap(state)
        return True

    def drain(self, name: str, draining: bool = True) -> bool:
        """Mark ``name`` as draining (no new requests) or undrain it."""
        state = self._by_name.get(name)
        if state is None:
            return False
        state.draining = draining
        return True

    def sync(self, source: str, specs: Iterable[InstanceSpec]) -> tuple[list[str], list[str]]:
        """Make the instances owned by ``source`` exactly ``specs``; return (added, removed) names."""
        wanted = {s.name: s for s in specs}
        added = [n for n in wanted if n not in self._by_name or self._by_name[n].removed]
        for spec in wanted.values():
            self.add(spec, source)
        removed = [s.name for s in self.all() if s.source == source and s.name not in wanted and not s.removed]
        for name in removed:
            self.remove(name)
        return added, removed

    def _reap(self, state: InstanceState) -> None:
        if state.removed and state.inflight == 0 and self._by_name.get(state.name) is state:
            del self._by_name[state.name]
            self._emit("remove", state, "")

    # ---- selection ----------------------------------------------------------------
    def score(self, state: InstanceState) -> float:
        """Load score of ``state`` (lower is better), per unit of instance weight."""
        w = self.weights
        kv = state.kv_usage or 0.0
        waiting = state.waiting or 0.0
        if state.role == "prefill":
            raw = (w.prefill_token_weight * state.outstanding_prompt_tokens
                   + w.prefill_kv_weight * kv + w.prefill_waiting_weight * waiting)
        else:
            raw = w.decode_seq_weight * state.active_seqs + w.decode_kv_weight * kv + w.decode_waiting_weight * waiting
        return raw / state.spec.weight

    def pick(self, role: Role, exclude: Iterable[str] = ()) -> InstanceState:
        """Least-loaded routable instance of ``role`` not in ``exclude``; ties rotate.

        Raises NoInstanceError listing why every candidate was skipped.
        """
        now = self.clock()
        excluded = set(exclude)
        best: list[InstanceState] = []
        best_score = 0.0
        for state in self._by_name.values():
            if state.role != role or state.name in excluded or not state.routable(now):
                continue
            sc = self.score(state)
            if not best or sc < best_score:
                best, best_score = [state], sc
            elif sc == best_score:
                best.append(state)
        if not best:
            reasons = {}
            for s in self.all(role):
                reasons[s.name] = "already failed for this request" if s.name in excluded else s.why_not_routable(now)
            raise NoInstanceError(role, reasons)
        return best[next(self._rr) % len(best)] if len(best) > 1 else best[0]

    # ---- load accounting ------------------------------------------------------------
    def begin(self, state: InstanceState, prompt_tokens: int = 0) -> None:
        """Count a request starting on ``state`` (prompt tokens for prefill, a sequence for decode)."""
        state.inflight += 1
        if state.role == "prefill":
            state.outstanding_prompt_tokens += prompt_tokens
        else:
            state.active_seqs += 1

    def end(self, state: InstanceState, prompt_tokens: int = 0) -> None:
        """Undo :meth:`begin` once the request on ``state`` finished (any outcome)."""
        state.inflight -= 1
        if state.role == "prefill":
            state.outstanding_prompt_tokens -= prompt_tokens
        else:
            state.active_seqs -= 1
        self._reap(state)

    # ---- passive and active health ----------------------------------------------------
    def record_success(self, state: InstanceState) -> None:
        state.consecutive_failures = 0
        state.served += 1

    def record_failure(self, state: InstanceState, reason: str, hard: bool = False) -> None:
        """Count a failed request; eject after ``eject_after`` in a row, or at once if ``hard``.

        hard: the instance is unreachable (connection refused/reset); it is also
        marked unhealthy until an active health check passes.
        """
        state.consecutive_failures += 1
        if hard:
            state.healthy = False
            state.health_reason = reason
        if hard or state.consecutive_failures >= self.eject_after:
            self.eject(state, reason)

    def eject(self, state: InstanceState, reason: str) -> None:
        """Take ``state`` out of rotation for ``eject_duration_s``."""
        now = self.clock()
        already = now < state.ejected_until
        state.ejected_until = now + self.eject_duration_s
        state.eject_reason = reason
        # One more failure after re-admission ejects again.
        state.consecutive_failures = max(0, self.eject_after - 1)
        if not already:
            self._emit("eject", state, reason)

    def record_health(self, state: InstanceState, ok: bool, reason: str = "") -> None:
        """Apply an active ``/health`` result."""
        if ok and not state.healthy:
            state.healthy, state.health_reason = True, "ok"
            self._emit("readmit", state, "health check passed")
        elif not ok and state.healthy:
            state.healthy, state.health_reason = False, reason
            self._emit("eject", state, f"health check: {reason}")
        elif ok:
            state.health_reason = "ok"
        else:
            state.health_reason = reason

    def summary(self) -> dict[str, Any]:
        """Counts of routable instances per role and the reasons others are skipped."""
        now = self.clock()
        out: dict[str, Any] = {}
        for role in ROLES:
            states = self.all(role)
            out[role] = {
                "total": len(states),
                "routable": sum(s.routable(now) for s in states),
                "unavailable": {s.name: s.why_not_routable(now) for s in states if not s.routable(now)},
            }
        return out

    def _emit(self, kind: str, state: InstanceState, reason: str) -> None:
        if self.on_event is not None:
            self.on_event(kind, state, reason)
