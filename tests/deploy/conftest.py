"""Fixtures: one mock-runtime run per stack, shared by the tests of this directory."""

from __future__ import annotations

import pytest

from ascend_runtime.config.loader import available_stacks, load_stack

from .harness import Run, run_stack

STACKS = available_stacks()
#: every stack the Pulumi program deploys: all but those of the local target (processes on this machine)
K8S_STACKS = [s for s in STACKS if load_stack(s).config.target != "local"]
_RUNS: dict[str, Run] = {}


def stack_run(stack: str) -> Run:
    """The cached mock run of a committed stack."""
    if stack not in _RUNS:
        _RUNS[stack] = run_stack(stack)
        assert _RUNS[stack].error is None, _RUNS[stack].error
    return _RUNS[stack]


@pytest.fixture(params=STACKS)
def any_run(request: pytest.FixtureRequest) -> Run:
    return stack_run(request.param)


@pytest.fixture(params=K8S_STACKS)
def k8s_run(request: pytest.FixtureRequest) -> Run:
    return stack_run(request.param)
