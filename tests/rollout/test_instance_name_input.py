"""`rollout --instance/--from`: a name with control characters or spaces is refused, shown escaped."""

from __future__ import annotations

import pytest

from ascend_runtime.cli import main

BAD = ["prefill-0\nerror: forged line", "decode-0\r", "a\x1b[31mred", "tab\there", "nul\x00", "del\x7f", "sp ace",
       "nel\x85", "x" * 257]


def test_bad_instance_names_exit_2_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--instance", "--from"):
        for name in BAD:
            assert main(["rollout", "--stack", "cm384-prod", "--dry-run", flag, name]) == 2, (flag, name)
            captured = capsys.readouterr()
            err = captured.err
            assert err.startswith(f"error: {flag}: ") and "not an instance name" in err, (flag, name, err)
            assert repr(name[:60]) in err, err  # shown quoted and escaped
            assert err.count("\n") == 1 and not any(c in err for c in "\r\x1b\x00\x7f\x85\t"), repr(err)
            assert captured.out == ""  # refused before anything is printed or planned
        assert main(["rollout", "--stack", "cm384-prod", "--dry-run", flag, ""]) == 2
        assert "an instance name cannot be empty" in capsys.readouterr().err


def test_a_good_name_still_reaches_the_rollout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rollout", "--stack", "cm384-prod", "--dry-run", "--instance", "decode-0"]) == 0
    assert "decode-0" in capsys.readouterr().out
