"""Every `ascend-deploy ...` (or `python -m ascend_runtime ...`) command line quoted in README.md, docs/ and
the rendered DEPLOYMENT.md parses.

Command lines are taken from code spans and fenced blocks; placeholders (NAME, URL, <stack>, ...) are
replaced by plausible values, alternatives (`a | b`) and optional parts ([...]) are expanded to their
first form. Parsing uses the real CLI parser, so a renamed command or flag fails here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ascend_runtime.cli import build_parser
from ascend_runtime.planner import load_plan
from ascend_runtime.render.launch import deployment_sheet

ROOT = Path(__file__).resolve().parents[2]
CODE = re.compile(r"`([^`\n]*(?:ascend-deploy|python -m ascend_runtime) [^`\n]*)`"
                  r"|^\s*(?:\$ )?((?:[A-Z_]+=\S* )*(?:ascend-deploy|python -m ascend_runtime) [^\n]*)$", re.MULTILINE)
#: what runs the CLI at the start of a documented line: `ascend-deploy`, `python -m ascend_runtime`, after env settings
LAUNCHER = re.compile(r"^(?:[A-Z_]+=\S* )*(?:ascend-deploy|python -m ascend_runtime) ")
#: placeholder -> a value the parser accepts
PLACEHOLDERS = {
    "NAME": "local", "<stack>": "local", "STACK": "local", "DIR": "out", "URL": "http://127.0.0.1:9000",
    "HOST": "a2-node-01", "FILE": "instances.yaml", "N": "1", "NS/NAME:PORT": "deepseek/pd-proxy:9000",
}


def _normalise(line: str) -> str | None:
    """A documented command line as the user would type it; None for prose mentions (no option given)."""
    line = line.split("#", 1)[0].strip().rstrip("\\").strip()
    line = LAUNCHER.sub("ascend-deploy ", line)
    if " --" not in line:
        return None  # a command named in prose (`ascend-deploy plan`), not a line to type
    line = re.sub(r"\s+&&.*$|\s*;.*$|\s*\|\s*(sha256sum|head|tail|jq|grep).*$", "", line)
    line = line.replace("\\|", "|")
    for _ in range(3):  # nested optional parts and alternatives: keep the first form
        line = re.sub(r"\[([^\[\]]*)\]", lambda m: m.group(1).split(" | ")[0].strip(), line)
        line = re.sub(r"\(([^()]*\|[^()]*)\)", lambda m: m.group(1).split("|")[0].strip(), line)
    line = re.sub(r"(\w+)(\|[\w-]+)+", r"\1", line)  # prefill|decode -> prefill
    if "..." in line or "<" in line and ">" not in line:
        line = line.replace("...", "").strip()
    for key, value in sorted(PLACEHOLDERS.items(), key=lambda kv: -len(kv[0])):
        line = re.sub(rf"(?<![\w-]){re.escape(key)}(?![\w-])", value, line)
    line = re.sub(r"<[^>]+>", "local", line)
    line = re.sub(r"(?<=\s)[A-Z][A-Z_]*(?=\s|$|\.|=)", "1", line)  # other upper-case placeholders (R, PORT)
    return line if line.startswith("ascend-deploy ") else None


def _join_continuations(text: str) -> str:
    """Shell line continuations (a trailing backslash) joined into one line."""
    return re.sub(r"\\\n\s*", " ", text)


def _command_lines() -> list[tuple[str, str]]:
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found: list[tuple[str, str]] = []
    for path in sources:
        for match in CODE.finditer(_join_continuations(path.read_text())):
            line = _normalise(match.group(1) or match.group(2))
            if line:
                found.append((str(path.relative_to(ROOT)), line))
    for stack in ("a2-staging", "cm384-prod"):
        for match in CODE.finditer(_join_continuations(deployment_sheet(load_plan(stack)))):
            line = _normalise(match.group(1) or match.group(2))
            if line:
                found.append((f"DEPLOYMENT.md of {stack}", line))
    return found


COMMAND_LINES = _command_lines()


def test_docs_quote_command_lines() -> None:
    assert len(COMMAND_LINES) >= 10, COMMAND_LINES  # the scan found the documented commands


@pytest.mark.parametrize(("where", "line"), COMMAND_LINES, ids=[f"{w}:{i}" for i, (w, _) in enumerate(COMMAND_LINES)])
def test_command_line_parses(where: str, line: str) -> None:
    argv = shlex.split(line)[1:]
    words = [w for w in argv if not w.startswith("-")]
    parser = build_parser(words[0] if words else None)
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        if argv and argv[-1] in ("--help", "-h", "--version") and exc.code == 0:
            return
        pytest.fail(f"{where}: `{line}` does not parse with the CLI (exit {exc.code})")


def test_a_stale_command_fails_the_check() -> None:
    parser = build_parser("check")
    with pytest.raises(SystemExit):
        parser.parse_args(["check", "--stack", "a2-staging"])  # the command DEPLOYMENT.md once named
