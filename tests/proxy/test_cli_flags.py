"""`ascend-deploy proxy` refuses every malformed flag before it builds or starts anything (exit 2, the flag named)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ascend_runtime.cli import main
import ascend_runtime.proxy.workers as workers

BASE = ["proxy", "--prefill", "http://127.0.0.1:19001", "--decode", "http://127.0.0.1:19002", "--port", "18990"]


class Started(Exception):
    """The command got as far as starting the proxy."""


def _cases(d: Path) -> list[tuple[list[str], str]]:
    """(extra argv, text the error must contain: the flag or field it names)."""
    return [
        (["--port", "70000"], "--port"), (["--host", ""], "--host"), (["--host", "no such host!"], "--host"),
        (["--workers", "0"], "--workers"), (["--workers", "100000"], "--workers"),
        (["--prefill", ""], "prefill"), (["--prefill", "ftp://x:1"], "URL"), (["--prefill", "http://x:99999"], "URL"),
        (["--prefill", "http://h:1,weight=nan"], "weight"), (["--prefill", "http://h:1,weight=x"], "weight"),
        (["--prefill", "http://h:1,name="], "name"), (["--decode", "http://h:1,name=a b"], "name"),
        (["--decode", "http://h:1\r\nx"], "URL"),
        (["--instances-file", str(d / "bad.json")], "cannot parse"), (["--instances-file", str(d / "ints.json")], "mapping"),
        (["--instances-file", str(d / "map.yaml")], "URLs or mappings"), (["--instances-file", str(d / "nope.json")],
                                                                         "--instances-file"),
        (["--instances-file", str(d)], "--instances-file"), (["--instances-file", str(d / "fifo")], "--instances-file"),
        (["--stack", ""], "--stack"), (["--k8s-namespace", "Bad_NS"], "--k8s-namespace"),
        (["--k8s-port-name", "x" * 100], "--k8s-port-name"), (["--k8s-prefill-selector", "=="], "--k8s-prefill-selector"),
        (["--k8s-decode-selector", "role in (decode"], "--k8s-decode-selector"), (["--admin-token-env", "1BAD"], "--admin-token-env"),
        (["--connect-timeout-s", "nan"], "--connect-timeout-s"), (["--connect-timeout-s", "-1"], "--connect-timeout-s"),
        (["--stream-idle-timeout-s", "inf"], "--stream-idle-timeout-s"), (["--prefill-timeout-s", "0"], "--prefill-timeout-s"),
        (["--health-interval-s", "1e308"], "--health-interval-s"), (["--health-timeout-s", "nan"], "--health-timeout-s"),
        (["--eject-after", "0"], "--eject-after"), (["--eject-duration-s", "-5"], "--eject-duration-s"),
        (["--max-ejection-percent", "150"], "--max-ejection-percent"), (["--failure-percent", "-1"], "--failure-percent"),
        (["--success-rate-stdev-factor", "nan"], "--success-rate-stdev-factor"),
        (["--header-timeout-s", "0"], "--header-timeout-s"), (["--max-body-bytes", "0"], "--max-body-bytes"),
        (["--max-attempts", "0"], "--max-attempts"), (["--prefill-token-weight", "nan"], "--prefill-token-weight"),
        (["--decode-kv-weight=-1"], "--decode-kv-weight"), (["--log-level", "LOUD"], "--log-level"),
        (["--eject-max-duration-s", "1", "--eject-duration-s", "10"], "--eject-max-duration-s"),
        # a timeout below a millisecond fails every request (and so ejects every instance)
        (["--connect-timeout-s", "1e-9"], "0.001"), (["--stream-idle-timeout-s", "0.0001"], "--stream-idle-timeout-s"),
        # 0 turns active checks off; anything else is a polling interval, never a loop without a pause
        (["--health-interval-s", "1e-9"], "--health-interval-s"), (["--health-interval-s", "0.001"], "0.01"),
        # a weight near the float limit makes every score infinite (all instances tie)
        (["--decode-kv-weight", "1e308"], "--decode-kv-weight"), (["--prefill-affinity-weight", "inf"], "1e+06"),
        (["--prefill-affinity-home-weight", "nan"], "--prefill-affinity-home-weight"),
        # whole numbers of blocks, bounded (the routing history's memory grows with the capacity)
        (["--prefill-affinity-block-tokens", "inf"], "--prefill-affinity-block-tokens"),
        (["--prefill-affinity-block-tokens", "1.5"], "whole number"),
        (["--prefill-affinity-block-tokens", "0"], "--prefill-affinity-block-tokens"),
        (["--prefill-affinity-capacity-blocks", "1e308"], "--prefill-affinity-capacity-blocks"),
        (["--prefill-affinity-capacity-blocks", "-1"], "--prefill-affinity-capacity-blocks"),
    ]


def test_bad_flags_exit_2_naming_the_flag_and_start_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "ints.json").write_text("[1, 2]")
    (tmp_path / "map.yaml").write_text("prefill: [5]")
    os.mkfifo(tmp_path / "fifo")

    def started(*_a: object, **_k: object) -> None:
        raise Started()

    monkeypatch.setattr(workers, "run_loop", started)
    monkeypatch.setattr(workers, "serve_workers", started)
    failures = []
    for extra, named in _cases(tmp_path):
        try:
            code = main(BASE + extra)
        except Started:
            code = "started"
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code
        err = capsys.readouterr().err
        if code != 2 or named not in err or "Traceback" in err:
            failures.append((extra, code, err.strip()[-200:]))
    assert not failures, failures
    # the same base with good values starts (the checks refuse only what is wrong)
    with pytest.raises(Started):
        main(BASE + ["--health-interval-s", "0", "--workers", "2", "--decode-kv-weight", "0",
                     "--prefill-affinity-capacity-blocks", "0", "--prefill-affinity-block-tokens", "64",
                     "--k8s-decode-selector", "app.kubernetes.io/component=decode,role in (leader)"])


@pytest.mark.parametrize(("field", "value"), [
    ("prefill_affinity_block_tokens", float("inf")), ("prefill_affinity_block_tokens", 2.5),
    ("prefill_affinity_capacity_blocks", 1e308), ("decode_seq_weight", float("nan")), ("prefill_kv_weight", 1e7),
    ("prefill_affinity_weight", -1.0),
])
def test_routing_weights_built_in_code_refuse_what_the_flags_refuse(field: str, value: float) -> None:
    from ascend_runtime.proxy.config import RoutingWeights

    with pytest.raises(ValueError, match="--" + field.replace("_", "-")):  # a ValueError, never an OverflowError
        RoutingWeights(**{field: value})
