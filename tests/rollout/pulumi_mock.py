"""The ServingSystem component of a committed stack, built under Pulumi's mock runtime (tests/deploy's mocks)."""

from __future__ import annotations

import asyncio

import pulumi

from ascend_runtime.deploy.components import ServingSystem, ServingSystemArgs
from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects import build_system
from tests.deploy.harness import PROJECT, RecordingMocks


def mock_system(stack: str) -> ServingSystem:
    """``ServingSystem(stack)`` as the program builds it, its components inspectable."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    plan = load_plan(stack)
    pulumi.runtime.set_mocks(RecordingMocks(), project=PROJECT, stack=stack, preview=False)
    captured: dict[str, ServingSystem] = {}

    @pulumi.runtime.test
    def program() -> None:
        captured["system"] = ServingSystem(stack, ServingSystemArgs(plan, build_system(plan)))

    try:
        program()
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    return captured["system"]
