"""The wait step of a rollout: a proxy replica that misses a poll (busy, restarting) is asked again
until the drain timeout; one that stays silent ends the wait with the instance undrained."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ascend_runtime.faults.proxies import ProxyError
from ascend_runtime.rollout.order import Target
from ascend_runtime.rollout.steps import Rollout, RolloutOptions, StepFailed

URL = "http://proxy"


class FlakyAdmin:
    """``listing`` fails ``misses`` times (or always), then reports ``inflight`` 0 for every target."""

    def __init__(self, misses: int | None) -> None:
        self.misses, self.calls, self.drains = misses, 0, []

    async def listing(self, url: str) -> dict[str, dict[str, Any]]:
        self.calls += 1
        if self.misses is None or self.calls <= self.misses:
            raise ProxyError(f"GET {url}/admin/instances: TimeoutError: ")
        return {"decode-0": {"name": "decode-0", "inflight": 0, "routable": False, "draining": True}}

    async def drain(self, url: str, name: str, drain: bool = True) -> None:
        self.drains.append((name, drain))


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def _rollout(admin: FlakyAdmin, said: list[str]) -> Rollout:
    target = Target(name="decode-0", role="decode", url="http://decode-0")
    rollout = Rollout([target], [target], admin, driver=None, check=None,  # type: ignore[arg-type]
                      options=RolloutOptions(drain_timeout_s=10.0, poll_s=0.0), say=said.append, clock=FakeClock())
    rollout.replicas = [URL]
    return rollout


def test_a_missed_poll_is_asked_again() -> None:
    said: list[str] = []
    admin = FlakyAdmin(misses=2)
    asyncio.run(_rollout(admin, said).wait_idle(Target(name="decode-0", role="decode", url="http://decode-0"), "[1/1] decode-0:"))
    assert admin.calls == 3
    assert sum("did not answer" in line for line in said) == 2, said
    assert any("no request in flight" in line for line in said), said
    assert admin.drains == []  # still drained: the rollout goes on to replace it


def test_a_replica_silent_for_the_whole_timeout_ends_the_wait_undrained() -> None:
    said: list[str] = []
    admin = FlakyAdmin(misses=None)
    with pytest.raises(StepFailed) as failed:
        asyncio.run(_rollout(admin, said).wait_idle(Target(name="decode-0", role="decode", url="http://decode-0"), "[1/1] decode-0:"))
    assert failed.value.step == "wait" and not failed.value.drained
    assert "no answer for 10 s" in failed.value.reason and "--drain-timeout-s" in failed.value.reason
    assert admin.drains == [("decode-0", False)]  # put back in service, untouched
