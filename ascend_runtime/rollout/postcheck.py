"""The post-check of a replaced instance, while it is still drained: ``/health``, then a PD round trip.

The proxies do not route to a drained instance, so the round trip goes straight to
the engines with the proxy's own protocol (``ascend_runtime.faults.recovery``, the
same check the fault watcher runs before it re-admits an instance): a replaced
prefill instance prefills for a serving decode instance, a replaced decode instance
decodes what a serving prefill instance prefilled.
"""

from __future__ import annotations

from typing import Protocol

import aiohttp

from ascend_runtime.faults.recovery import (
    Endpoint,
    RecoveryCheckFailed,
    check_health,
    pd_round_trip,
)
from ascend_runtime.rollout.order import Target


class PostCheckFailed(Exception):
    """The replaced instance is not fit to serve; the message says what failed."""


class PostCheck(Protocol):
    """Checks ``target`` (replaced, drained) with ``partner`` (a serving instance of the other role)."""

    async def __call__(self, target: Target, partner: Target) -> str:
        """A one-line summary on success; raises PostCheckFailed."""
        ...


class EnginePostCheck:
    """``/health`` of the leader, then one non-streaming completion through prefill and decode."""

    def __init__(self, session: aiohttp.ClientSession, timeout_s: float = 30.0) -> None:
        self.session = session
        self.timeout_s = timeout_s

    async def __call__(self, target: Target, partner: Target) -> str:
        inst, other = Endpoint(target.name, target.url), Endpoint(partner.name, partner.url)
        try:
            await check_health(self.session, inst, self.timeout_s)
            prefill, decode = (inst, other) if target.role == "prefill" else (other, inst)
            detail = await pd_round_trip(self.session, prefill, decode, self.timeout_s)
        except RecoveryCheckFailed as exc:
            raise PostCheckFailed(str(exc)) from None
        return f"/health 200; PD round trip {detail}"
