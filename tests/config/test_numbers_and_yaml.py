"""Numbers, sizes and YAML 1.1 spellings: refused naming the key and line, bounded in time and in the message.

A whole number of thousands of digits, a YAML 1.1 octal, base-60, binary or grouped number, a YAML 1.1
boolean (``yes``/``on``), a merge key ``<<`` given twice: each is exit 2 naming the key path and the line,
never a traceback nor a silent reading. A 16 MB namespace is judged fast, and a 1 MB key is cut in the error.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ascend_runtime.cli import main
from ascend_runtime.config.errors import ConfigError
from ascend_runtime.config.loader import misspelt_namespace, parse_stack_config, parse_yaml
from tests.stack_copies import stacks_with_text



@pytest.mark.parametrize(("text", "path", "words"), [
    ("a:\n  b: 0022\n", "a.b", ("octal", "18", "line 2")),
    ("a:\n  b: -0017\n", "a.b", ("octal", "line 2")),
    ("a:\n  b: 2:30:00\n", "a.b", ("base-60", "9000", "line 2")),
    ("a:\n  b: 1:30.5\n", "a.b", ("base-60", "line 2")),
    ("a: [1, 0b101]\n", "a[1]", ("binary", "line 1")),
    ("a: 1_000\n", "a", ("digit groups", "line 1")),
    ("a: yes\n", "a", ("boolean", "line 1")),
    ("a:\n  - Off\n", "a[0]", ("boolean", "line 2")),
    ("a: " + "9" * 5000 + "\n", "a", ("5000 digits", "line 1")),
    ("? " + "9" * 5000 + "\n: 1\n", "9" * 5, ("5000 digits",)),
    ("x: &x {p: 1}\ny: &y {q: 2}\nz:\n  <<: *x\n  <<: *y\n", "z.<<", ("merge key", "lines 4 and 5", "<<: [*a, *b]")),
    ("a:\n  b: 1\n  b: 2\n", "a.b", ("given twice", "lines 2 and 3")),
], ids=["octal", "octal-negative", "base-60", "base-60-float", "binary", "digit-groups", "yes", "off-in-a-list",
        "5000-digits", "5000-digit-key", "merge-twice", "key-twice"])
def test_yaml_1_1_spellings_and_long_numbers_are_refused_naming_key_and_line(text: str, path: str,
                                                                           words: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_yaml(text, "stack", "Pulumi.x.yaml")
    message = str(err.value)
    assert err.value.problems[0].path.startswith(path), message
    assert all(w in message for w in words), message
    assert len(message) < 1000


@pytest.mark.parametrize("text", ['a: "0022"\n', "a: '2:30:00'\n", "a: 'yes'\n", "a: 22\n", "a: 0x1F\n",
                                  "a: true\n", "a: 1.5e3\n", "x: &x {p: 1}\nz:\n  <<: *x\n  q: 2\n"])
def test_yaml_1_2_spellings_and_quoted_text_pass(text: str) -> None:
    parse_yaml(text, "stack")


@pytest.mark.parametrize(("value", "words"), [("9" * 5000, ("5000 digits",)), ("0022", ("octal",)),
                                               ("2:30:00", ("base-60",))])
def test_plan_exits_2_naming_the_key_never_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        value: str, words: tuple[str, ...]) -> None:
    stacks = stacks_with_text(tmp_path, "local", "    max_num_seqs: 16\n", f"    max_num_seqs: {value}\n")
    assert main(["plan", "--stack", "local", "--stacks-dir", str(stacks)]) == 2
    err = capsys.readouterr().err
    assert "  - prefill.max_num_seqs: " in err and all(w in err for w in words), err[:500]
    assert "Traceback" not in err and len(err) < 2000


def test_a_16_mb_namespace_is_judged_fast() -> None:
    namespace = "a" * 16_000_000
    started = time.monotonic()
    assert not misspelt_namespace(namespace)
    with pytest.raises(ConfigError) as err:  # the other keys are missing; the namespace is no misspelling
        parse_stack_config({f"{namespace}:key": 1})
    assert "misspelling" not in str(err.value)
    assert time.monotonic() - started < 2.0
    assert misspelt_namespace("ascend-deepsek") and misspelt_namespace("Ascend_DeepSeek")


def test_a_1_mb_key_is_cut_in_the_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = "k" * 1_000_000
    stacks = stacks_with_text(tmp_path, "local", "    max_num_seqs: 16\n", f"    ? {key}\n    : 16\n")
    assert main(["plan", "--stack", "local", "--stacks-dir", str(stacks)]) == 2
    err = capsys.readouterr().err
    assert "  - prefill.kkk" in err and "unknown key" in err and len(err) < 2000, len(err)
    with pytest.raises(ConfigError) as exc:
        parse_stack_config({key: 1})  # no namespace: the hint quotes the key
    assert len(str(exc.value)) < 3000
    with pytest.raises(ConfigError) as exc:
        parse_stack_config({f"ascend-deepsek:{key}": 1})  # a misspelt namespace: the fix quotes the name
    assert len(str(exc.value)) < 3000


def test_a_flag_value_of_thousands_of_digits_is_cut_in_the_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["up", "--stack", "local", "--num-prompts", "9" * 5000])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--num-prompts" in err and "invalid int value" in err and len(err) < 1000
    assert "9" * 100 not in err
