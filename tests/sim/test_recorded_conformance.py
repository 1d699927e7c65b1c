"""The simulator, and the proxy in front of simulators, against vLLM 0.23.0's recorded answers.

The fixtures (tests/fixtures/vllm-0.23.0/) were recorded from the real engine by
``python -m ascend_runtime.conformance.record``; this test needs no engine. Each target answers the same
corpus in-process; every difference from the recording must be listed in ``intentional.json`` (and so in
docs/simulator.md), and every entry there must still match a difference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ascend_runtime.conformance import compare
from ascend_runtime.conformance.corpus import corpus
from ascend_runtime.conformance.drive import drive
from ascend_runtime.conformance.fixtures import DEFAULT_DIR, load_intentional, load_recording
from ascend_runtime.sim import api
from ascend_runtime.sim.metrics import SimMetrics
from tests.compat.conftest import start_target

DOC = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"


async def _answers(kind: str) -> dict[str, dict[str, Any]]:
    target = await start_target(kind)
    try:
        return await drive(target.url)
    finally:
        await target.stop()


def _report(diffs: list[compare.Difference]) -> str:
    return "\n".join(str(d) for d in diffs)


def test_recording_covers_the_corpus() -> None:
    recorded = load_recording()
    assert set(recorded) == {case.name for case in corpus()}
    assert len(recorded) >= 70


@pytest.mark.parametrize("kind,target", [("direct", "simulator"), ("pd", "proxy")])
async def test_target_matches_the_recording(kind: str, target: str) -> None:
    recorded, table = load_recording(), load_intentional()
    found = await _answers(kind)
    diffs = compare.compare(recorded, found)
    unexplained = [d for d in diffs if not compare.is_intentional(d, target, table)]
    assert not unexplained, f"{target} differs from vLLM 0.23.0's recorded answers:\n{_report(unexplained)}"
    stale = compare.unused_entries(diffs, target, table)
    assert not stale, f"intentional differences of the {target} that no longer occur: {stale}"
    if target == "simulator":
        both = [e for e in table if e["target"] == "both"]
        assert not compare.unused_entries(diffs, "both", both), "an entry for both targets matches nothing"


async def test_a_planted_difference_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A renamed metric and a changed error shape in the simulator are reported, naming case and path."""
    exposition = SimMetrics.exposition

    def renamed(self: SimMetrics, *args: object, **kwargs: object) -> bytes:
        return exposition(self, *args, **kwargs).replace(b"vllm:generation_tokens", b"vllm:generated_tokens")

    error_body = api.error_body

    def reshaped(message: str, code: int, err_type: str = "BadRequestError", param: str | None = None) -> dict:
        body = error_body(message, code, err_type, param)
        body["error"]["kind"] = body["error"].pop("type")
        return body

    monkeypatch.setattr(SimMetrics, "exposition", renamed)
    monkeypatch.setattr(api, "error_body", reshaped)
    diffs = compare.unexplained(load_recording(), await _answers("direct"), "simulator", load_intentional())
    wheres = {(d.case, d.where) for d in diffs}
    assert ("metrics", "metrics family vllm:generation_tokens") in wheres, _report(diffs)
    assert ("metrics", "metrics family vllm:generated_tokens") in wheres, _report(diffs)
    assert ("cmpl.bad_model", "body path error.type") in wheres, _report(diffs)
    assert ("cmpl.bad_model", "body path error.kind") in wheres, _report(diffs)
    assert "cmpl.bad_model: body path error.type: recorded ['str'], found 'absent'" in _report(diffs)


def test_docs_list_every_intentional_difference() -> None:
    doc = DOC.read_text()
    for entry in load_intentional(DEFAULT_DIR):
        assert f"`{entry['case']}`" in doc and f"`{entry['where']}`" in doc, entry
