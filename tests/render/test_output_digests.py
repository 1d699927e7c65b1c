"""Plans and renders of every committed stack, pinned by SHA-256: a move between modules changes no byte.

For each stack in ``stacks/`` the digests cover what ``ascend-deploy`` prints or writes:
``plan``, ``plan --json`` and ``plan --advise`` (stdout, UTF-8) and the whole ``render`` tree
(every file's path and content, ``manifests/`` and ``.ascend-render.json`` included). A tree's digest is
SHA-256 over its sorted ``<path> <file sha256>`` lines, so a renamed file changes it as an edited one does.

Regenerate the digests after an intended change of a Plan or a render:

    UPDATE_DIGESTS=1 python -m pytest -p no:cacheprovider tests/render/test_output_digests.py
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from ascend_runtime.cli import main

ROOT = Path(__file__).resolve().parents[2]
DIGESTS = Path(__file__).parent / "output_digests.json"
#: Every committed stack: ``stacks/Pulumi.<name>.yaml``.
STACKS = tuple(sorted(p.name[len("Pulumi."):-len(".yaml")] for p in (ROOT / "stacks").glob("Pulumi.*.yaml")))
#: ``ascend-deploy plan`` variants whose stdout is pinned, by key in the digest file.
PLAN_COMMANDS: dict[str, tuple[str, ...]] = {"plan": (), "plan --json": ("--json",), "plan --advise": ("--advise",)}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree_digest(root: Path) -> str:
    """SHA-256 (hex) of every file under ``root``: its sorted ``<relative path> <sha256 of bytes>`` lines."""
    lines = [f"{p.relative_to(root).as_posix()} {_sha256(p.read_bytes())}\n"
             for p in sorted(root.rglob("*")) if p.is_file()]
    return _sha256("".join(lines).encode())


def stack_digests(stack: str, out: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """Digest (hex) of each pinned output of ``stack``: the ``plan`` variants' stdout and the render tree."""
    found: dict[str, str] = {}
    capsys.readouterr()
    for key, extra in PLAN_COMMANDS.items():
        assert main(["plan", "--stack", stack, *extra]) == 0, f"{key} --stack {stack} failed"
        found[key] = _sha256(capsys.readouterr().out.encode())
    assert main(["render", "--stack", stack, "--out", str(out)]) == 0, f"render --stack {stack} failed"
    capsys.readouterr()
    found["render"] = tree_digest(out)
    return found


def test_every_stack_is_pinned() -> None:
    """The digest file names exactly the committed stacks (a new stack is pinned when it is added)."""
    if os.environ.get("UPDATE_DIGESTS") == "1":
        pytest.skip("regenerating")
    assert sorted(json.loads(DIGESTS.read_text())) == sorted(STACKS), "UPDATE_DIGESTS=1 to pin a new stack"


@pytest.mark.parametrize("stack", STACKS)
def test_plan_and_render_are_byte_identical(stack: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = stack_digests(stack, tmp_path / "render", capsys)
    pinned = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    if os.environ.get("UPDATE_DIGESTS") == "1":
        pinned[stack] = got
        DIGESTS.write_text(json.dumps(dict(sorted(pinned.items())), indent=2, sort_keys=True) + "\n")
        return
    want = pinned.get(stack)
    assert want is not None, f"{stack} is not pinned; UPDATE_DIGESTS=1 to pin it"
    changed = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    assert not changed, f"{stack}: {', '.join(changed)} changed; UPDATE_DIGESTS=1 to accept an intended change"
