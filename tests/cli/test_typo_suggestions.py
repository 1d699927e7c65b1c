"""A mistyped option is named as unknown with the closest real one, exit 2; not reported as a missing option."""

from __future__ import annotations

import pytest

from ascend_runtime.cli import main


@pytest.mark.parametrize(("argv", "unknown", "suggestion"), [
    (["plan", "--stak", "a2-staging"], "--stak", "--stack"),
    (["plan", "--stack", "a2-staging", "--jsno"], "--jsno", "--json"),
    (["render", "--stack=local", "--out", "x", "--froce"], "--froce", "--force"),
    (["balance", "plan", "--histroy", "h.npy", "--ranks", "4", "--slots", "9", "--out", "m"], "--histroy", "--history"),
    (["check", "smoke", "--endpont", "http://127.0.0.1:1"], "--endpont", "--endpoint"),
    (["down", "--stak=local"], "--stak", "--stack"),
])
def test_an_unknown_option_suggests_the_closest(argv: list[str], unknown: str, suggestion: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"unrecognized argument {unknown}; did you mean {suggestion}?" in err
    assert "required" not in err


def test_values_that_look_like_options_are_not_flagged(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "a2-staging", "--json"]) == 0  # known options pass
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--sta", "a2-staging", "--json"])  # an abbreviation argparse resolves is not a typo
    assert exit_.value.code == 2 and "--stacks-dir" in capsys.readouterr().err  # ambiguous: argparse's own message


def test_an_option_with_nothing_close_is_named_without_a_guess(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--stack", "a2-staging", "--zzzzzz"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unrecognized argument --zzzzzz" in err and "did you mean" not in err
