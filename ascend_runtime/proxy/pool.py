"""Live instance state and load-aware selection (prefill and decode pools).

All methods are synchronous and called from the event loop thread only, so no
locks are needed. Loads are counters kept by the proxy itself (outstanding
prompt tokens, active decode streams) refined by gauges scraped from each
instance's ``/metrics`` (``vllm:kv_cache_usage_perc``,
``vllm:num_requests_waiting``).
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from ascend_runtime.proxy.affinity import AffinitySettings, PrefixAffinity, PromptBlocks
from ascend_runtime.proxy.config import OutlierPolicy, RoutingWeights
from ascend_runtime.proxy.instances import ROLES, InstanceSpec, Role

log = logging.getLogger(__name__)


#: Ejection reasons meaning the instance is down (not capped by max_percent, never used in panic routing).
DOWN_REASONS = ("connect_failure", "health_check")


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
    health_reason: str = "not checked yet"
    # passive evidence from real traffic
    consecutive_errors: int = 0
    consecutive_connect_failures: int = 0
    outcomes: deque = field(default_factory=deque)
    last_failure: str = ""
    # active checks
    check_failures: int = 0
    slow_checks: int = 0
    # ejection
    ejected: bool = False
    ejected_until: float = 0.0
    eject_kind: str = ""
    eject_reason: str = ""
    eject_count: int = 0
    readmitted_at: float = 0.0
    outlier: str = ""  # outlier evidence while kept in rotation by max_percent ('' = none)
    draining: bool = False
    #: drained with ``migrate``: its streams are moved to other instances, also those starting later
    evacuating: bool = False
    removed: bool = False
    served: int = 0
    #: the engine's context limit in tokens, from its ``GET /v1/models`` (``max_model_len``); None until read
    max_model_len: int | None = None
    #: whether the health loop asked ``/v1/models`` since the instance last passed a check after failing one
    model_info_read: bool = False
    #: the streams being relayed from this instance now (objects with ``migrate() -> bool``, forward.py)
    streams: set = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def role(self) -> Role:
        return self.spec.role

    @property
    def down(self) -> bool:
        """Ejected because it refused connections or failed active checks."""
        return self.ejected and self.eject_kind in DOWN_REASONS

    @property
    def healthy(self) -> bool:
        return not self.down

    @property
    def consecutive_failures(self) -> int:
        return max(self.consecutive_errors, self.consecutive_connect_failures)

    def routable(self, now: float) -> bool:
        """True if new requests may be sent here (outliers kept in rotation count as routable)."""
        return not self.ejected and not self.draining and not self.removed

    def why_not_routable(self, now: float) -> str:
        """Human-readable reason this instance is skipped ('' if routable)."""
        if self.removed:
            return "removed"
        if self.draining:
            return "draining"
        if self.ejected:
            if now < self.ejected_until:
                return f"ejected for {self.ejected_until - now:.1f}s more ({self.eject_reason})"
            return f"ejected, waiting for a passing health check ({self.eject_reason})"
        return ""

    def snapshot(self, now: float) -> dict[str, Any]:
        """JSON-ready view for ``GET /admin/instances`` and ``/health``."""
        return {
            **self.spec.to_dict(),
            "source": self.source,
            "routable": self.routable(now),
            "status": self.why_not_routable(now) or ("ok" if not self.outlier else f"outlier ({self.outlier})"),
            "healthy": self.healthy,
            "draining": self.draining,
            "evacuating": self.evacuating,
            "inflight": self.inflight,
            "outstanding_prompt_tokens": self.outstanding_prompt_tokens,
            "active_seqs": self.active_seqs,
            "kv_cache_usage": self.kv_usage,
            "num_requests_waiting": self.waiting,
            "consecutive_failures": self.consecutive_failures,
            "ejections": self.eject_count,
            "health": self.health_reason,
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

    ``on_event(kind, state, reason)`` is called for ``eject`` (reason: the
    ejection kind), ``eject_skipped`` (outlier kept in rotation by the
    max-percent cap), ``readmit``, ``panic`` (a pick that had to use an outlier
    or ejected instance), ``slow_check``, ``add``, ``remove``; the metrics
    module hooks in there. Ejection policy: :class:`OutlierPolicy`.
    ``active_checks``: re-admission waits for a passing health check (set when
    the health checker runs); otherwise an instance is re-admitted as soon as
    its ejection time is over.
    """

    weights: RoutingWeights = field(default_factory=RoutingWeights)
    policy: OutlierPolicy = field(default_factory=OutlierPolicy)
    active_checks: bool = False
    on_event: EventHook | None = None
    clock: Callable[[], float] = time.monotonic
    _by_name: dict[str, InstanceState] = field(default_factory=dict)
    _rr: itertools.count = field(default_factory=itertools.count)
    #: KV-cache affinity of prefill routing (proxy/affinity.py); built from ``weights`` unless given.
    affinity: PrefixAffinity | None = None
    #: Prompt tokens the last pick expected cached on the instance it chose (0 for decode or load-only).
    last_expected_hit: int = 0

    def __post_init__(self) -> None:
        w = self.weights
        if self.affinity is None:
            self.affinity = PrefixAffinity(AffinitySettings(
                w.prefill_affinity_weight, w.prefill_affinity_home_weight, int(w.prefill_affinity_block_tokens),
                int(w.prefill_affinity_capacity_blocks)))

    # ---- membership -------------------------------------------------------------
    def get(self, name: str) -> InstanceState | None:
        return self._by_name.get(name)

    def all(self, role: Role | None = None) -> list[InstanceState]:
        return [s for s in self._by_name.values() if role is None or s.role == role]

    def members(self, name: str) -> list[InstanceState]:
        """The endpoints ``name`` designates, in listing order: every endpoint whose engine instance
        (``spec.group``) is ``name`` (all DP ranks of an instance under rank serving), and the endpoint called
        ``name``; ``[]`` when neither exists. Under instance serving this is exactly the endpoint ``name``."""
        return [s for s in self._by_name.values() if s.spec.group == name or s.name == name]

    def max_model_len(self, role: Role) -> int | None:
        """The smallest context limit (tokens) the serving instances of ``role`` reported, None if none did."""
        known = [s.max_model_len for s in self.all(role) if not s.removed and s.max_model_len is not None]
        return min(known) if known else None

    def add(self, spec: InstanceSpec, source: str = "static") -> InstanceState:
        """Add ``spec`` or update the instance of that name (keeps its counters).

        At another URL the instance is another server (the fault watcher moved it to a spare node): its
        limit is read again, and the old server's ejection and failure evidence no longer hold.
        """
        state = self._by_name.get(spec.name)
        if state is not None:
            if state.spec.url != spec.url:
                state.max_model_len, state.model_info_read = None, False
                self._reset_evidence(state)
                self.readmit(state, f"now served at {spec.url}")
            state.spec, state.source = spec, source
            state.removed = state.draining = state.evacuating = False
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

    def drain(self, name: str, draining: bool = True, migrate: bool = False) -> bool:
        """Mark ``name`` as draining (no new requests) or undrain it.

        ``migrate``: also move its in-flight streams to other instances (:meth:`migrate_streams`),
        now and for any stream that starts relaying from it later, until it is undrained.
        """
        state = self._by_name.get(name)
        if state is None:
            return False
        state.draining = draining
        state.evacuating = draining and migrate
        return True

    def others_routable(self, state: InstanceState) -> bool:
        """True when another instance of ``state``'s role can take requests now."""
        now = self.clock()
        return any(s is not state and s.routable(now) for s in self.all(state.role))

    def migrate_streams(self, name: str) -> int:
        """Ask every stream relayed from ``name`` to move (forward.py continues each elsewhere).

        Returns how many agreed (a stream near its end, or of a shape that cannot be continued,
        finishes in place). Nothing moves when no other instance of the role is routable: the
        streams finish where they are rather than fail.
        """
        state = self._by_name.get(name)
        if state is None or not state.streams:
            return 0
        if not self.others_routable(state):
            log.warning("%s instance %s: %d stream(s) not migrated, no other %s instance is routable; they finish "
                        "in place", state.role, name, len(state.streams), state.role)
            return 0
        return sum(1 for stream in list(state.streams) if stream.migrate())

    def track(self, state: InstanceState, stream: Any) -> None:
        """A stream starts relaying from ``state``; on an evacuating instance it is moved at once."""
        state.streams.add(stream)
        if state.evacuating and self.others_routable(state):
            stream.migrate()

    def untrack(self, state: InstanceState, stream: Any) -> None:
        state.streams.discard(stream)

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
            if self.affinity is not None:
                self.affinity.forget(state.name)
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

    def pick(self, role: Role, exclude: Iterable[str] = (), count: bool = True,
             request: dict[str, Any] | None = None) -> InstanceState:
        """Least-loaded routable instance of ``role`` not in ``exclude``; ties rotate.

        ``request``: the client's request body; for prefill the prompt tokens expected in each instance's
        prefix cache are credited against its load (proxy/affinity.py), and the choice is recorded in the
        routing history when ``count``. :meth:`pick_prefill` also returns the tokens to charge.

        Instances with outlier evidence kept in rotation, then ejected outliers
        (not down ones), are used only when nothing else is left (panic
        routing; ``count`` False: a look-ahead, not counted). Raises
        NoInstanceError listing why every candidate was skipped.
        """
        now = self.clock()
        excluded = set(exclude)
        tiers: tuple[list[InstanceState], list[InstanceState], list[InstanceState]] = ([], [], [])
        for state in self._by_name.values():
            if state.role != role or state.name in excluded or state.removed or state.draining:
                continue
            if state.ejected and not self.active_checks and now >= state.ejected_until:
                self.readmit(state, "ejection time over")
            if not state.ejected:
                tiers[1 if state.outlier else 0].append(state)
            elif not state.down:
                tiers[2].append(state)
        for i, tier in enumerate(tiers):
            if tier:
                if i and count:
                    self._emit("panic", tier[0], "outlier" if i == 1 else "ejected")
                blocks = None
                if request is not None and role == "prefill" and self.affinity is not None \
                        and self.affinity.settings.enabled:
                    blocks = self.affinity.blocks(request)
                chosen, self.last_expected_hit = self._least_loaded(tier, blocks)
                if blocks is not None and count:
                    self.affinity.record(chosen.name, blocks)  # type: ignore[union-attr]
                return chosen
        reasons = {}
        for s in self.all(role):
            reasons[s.name] = "already failed for this request" if s.name in excluded else s.why_not_routable(now)
        raise NoInstanceError(role, reasons)

    def check_available(self, role: Role, exclude: Collection[str] = ()) -> None:
        """Raise NoInstanceError, as :meth:`pick` would, if no ``role`` instance outside ``exclude`` can be
        picked now; nothing is chosen or counted. One pass that stops at the first routable instance (no
        ranking); only when there is none does :meth:`pick` (``count`` False) decide, which readmits
        instances whose ejection is over, falls back to ejected ones (panic routing) or raises."""
        now = self.clock()
        for state in self._by_name.values():
            if state.role == role and state.name not in exclude and state.routable(now):
                return
        self.pick(role, exclude, count=False)

    def pick_prefill(self, exclude: Iterable[str], request: dict[str, Any] | None,
                     prompt_tokens: int) -> tuple[InstanceState, int]:
        """:meth:`pick` a prefill instance for ``request``; also the prompt tokens to charge it with
        :meth:`begin`/:meth:`end`: ``prompt_tokens`` minus the tokens expected in its prefix cache (the work it
        will do), at least 1; ``prompt_tokens`` itself under load-only routing or without an expected hit."""
        state = self.pick("prefill", exclude, request=request)
        return state, max(1, prompt_tokens - self.last_expected_hit) if self.last_expected_hit else prompt_tokens

    def _least_loaded(self, states: list[InstanceState],
                      blocks: PromptBlocks | None = None) -> tuple[InstanceState, int]:
        """(the lowest-scored of ``states``, its expected cached prompt tokens); ties rotate."""
        best: list[InstanceState] = []
        best_score = 0.0
        aff = self.affinity
        hits: dict[str, int] = {}
        if blocks is not None and aff is not None:
            hits = aff.expected(blocks, [s.name for s in states])
        credit = self.weights.prefill_token_weight * (aff.settings.weight if aff is not None else 0.0)
        for state in states:
            sc = self.score(state)
            if hits.get(state.name):
                sc -= credit * hits[state.name] / state.spec.weight
            if not best or sc < best_score:
                best, best_score = [state], sc
            elif sc == best_score:
                best.append(state)
        chosen = best[next(self._rr) % len(best)] if len(best) > 1 else best[0]
        return chosen, hits.get(chosen.name, 0)

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

    # ---- passive and active health (outlier detection) --------------------------------
    def record_success(self, state: InstanceState) -> None:
        """A request on ``state`` succeeded."""
        state.consecutive_errors = state.consecutive_connect_failures = 0
        state.served += 1
        state.outlier = ""
        self._window(state, True)

    def record_failure(self, state: InstanceState, reason: str, hard: bool = False) -> None:
        """A request on ``state`` failed: 5xx, timeout or bad answer, or (``hard``) a refused/reset
        connection or broken stream. Ejects on the policy's passive evidence."""
        p = self.policy
        state.last_failure = reason
        self._window(state, False)
        if hard:
            state.consecutive_connect_failures += 1
            if state.consecutive_connect_failures >= p.consecutive_connect_failures:
                self.eject(state, "connect_failure", f"{state.consecutive_connect_failures} connect failure(s) "
                                                     f"in a row, last: {reason}")
                return
        else:
            state.consecutive_errors += 1
            if state.consecutive_errors >= p.consecutive_errors:
                self.eject(state, "consecutive_errors", f"{state.consecutive_errors} failed requests in a row "
                                                        f"(5xx/timeout), last: {reason}")
                return
        self._check_rates(state)

    def _window(self, state: InstanceState, ok: bool) -> None:
        state.outcomes.append(ok)
        while len(state.outcomes) > max(1, self.policy.window):
            state.outcomes.popleft()

    def _check_rates(self, state: InstanceState) -> None:
        """Success-rate outlier check (stdev across the role) and failure-percentage check of ``state``."""
        p = self.policy
        n = len(state.outcomes)
        if n < max(1, p.min_requests):
            return
        rate = 100.0 * sum(state.outcomes) / n
        if p.failure_percent > 0 and 100.0 - rate >= p.failure_percent:
            self.eject(state, "failure_percent", f"{100 - rate:.0f}% of the last {n} requests failed "
                                                 f"(threshold {p.failure_percent:g}%)")
            return
        rates = [100.0 * sum(s.outcomes) / len(s.outcomes) for s in self.all(state.role)
                 if not s.removed and len(s.outcomes) >= max(1, p.min_requests)]
        if len(rates) < max(2, p.success_rate_min_hosts):
            return
        threshold = statistics.fmean(rates) - p.stdev_factor * statistics.pstdev(rates)
        if rate < threshold:
            self.eject(state, "success_rate", f"success rate {rate:.0f}% over the last {n} requests is below "
                                              f"{threshold:.0f}% (role mean - {p.stdev_factor:g} stdev)")

    def eject(self, state: InstanceState, kind: str, reason: str) -> bool:
        """Take ``state`` out of rotation for ``base_s * n`` (n-th ejection in a row, at most ``max_s``).

        kind: connect_failure, health_check (down), consecutive_errors,
        success_rate, failure_percent (outliers; capped by ``max_percent``).
        Returns False if the cap kept it in rotation.
        """
        p = self.policy
        now = self.clock()
        if state.ejected:
            if kind in DOWN_REASONS and state.eject_kind not in DOWN_REASONS:
                state.eject_kind, state.eject_reason = kind, reason  # an ejected outlier turned out down
            return True
        if kind not in DOWN_REASONS:
            up = [s for s in self.all(state.role) if not s.removed and not s.draining and not s.down]
            ejected = sum(1 for s in up if s.ejected)
            allowed = math.floor(len(up) * p.max_percent / 100.0 + 1e-9)
            if ejected + 1 > allowed:
                if not state.outlier:
                    log.warning("%s instance %s kept in rotation (max %g%% of %d ejected): %s", state.role,
                                state.name, p.max_percent, len(up), reason)
                    self._emit("eject_skipped", state, kind)
                state.outlier = reason
                self._reset_evidence(state)
                return False
        if state.eject_count and now - state.readmitted_at > p.max_s:
            state.eject_count = 0  # stayed in rotation long enough: the backoff starts again
        state.eject_count += 1
        duration = min(p.max_s, p.base_s * state.eject_count)
        state.ejected, state.ejected_until = True, now + duration
        state.eject_kind, state.eject_reason, state.outlier = kind, reason, ""
        self._reset_evidence(state)
        log.warning("ejected %s instance %s for %.1fs (ejection %d, %s): %s", state.role, state.name, duration,
                    state.eject_count, kind, reason)
        self._emit("eject", state, kind)
        return True

    def _reset_evidence(self, state: InstanceState) -> None:
        state.consecutive_errors = state.consecutive_connect_failures = state.check_failures = 0
        state.outcomes.clear()

    def readmit(self, state: InstanceState, why: str) -> None:
        """Put an ejected instance back in rotation."""
        if not state.ejected:
            return
        state.ejected = False
        state.readmitted_at = self.clock()
        log.info("re-admitted %s instance %s (was ejected: %s): %s", state.role, state.name, state.eject_reason, why)
        self._emit("readmit", state, why)

    def record_health(self, state: InstanceState, ok: bool, reason: str = "", slow: bool = False) -> None:
        """Apply an active ``/health`` result: ``ok`` (200), a failure (refused, non-200) or ``slow`` (timed out).

        A slow check counts as failed only if the instance's last real request failed too.
        """
        now = self.clock()
        if ok:
            state.check_failures = state.slow_checks = 0
            state.health_reason = "ok"
            if state.ejected and now >= state.ejected_until:
                self.readmit(state, "ejection time over and health check passed")
            return
        if slow and state.consecutive_failures == 0:
            state.slow_checks += 1
            state.health_reason = f"slow ({reason}); serving requests"
            self._emit("slow_check", state, reason)
            return
        state.check_failures += 1
        state.health_reason = reason
        if state.check_failures >= max(1, self.policy.health_failures):
            self.eject(state, "health_check", f"{state.check_failures} failed health checks in a row, last: {reason}")

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
