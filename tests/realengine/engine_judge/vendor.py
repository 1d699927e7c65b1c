"""Refresh the vendored vLLM-Ascend sources: ``python -m tests.realengine.engine_judge.vendor --git-dir DIR``.

Runs the engine judge on every rank script of every committed stack against the whole upstream tree of the
tag (``git archive`` of the commit, from a clone or bare mirror of vllm-project/vllm-ascend), then rewrites
``tests/realengine/vendor/vllm_ascend_0_23_0/vllm_ascend`` with exactly the files those imports looked for,
unmodified, and ``LICENSE``. Needs the real engine (``ascend-deploy engine install``).
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ascend_runtime.local.vllm_engine.install import engine_env
from tests.realengine.engine_judge.cases import VENDOR, all_stack_cases, run_judge

COMMIT = "5cb98caaadeff42b5b62b996e34bb2aaa29d20fd"  # tag v0.23.0


def extract(git_dir: Path, dest: Path, paths: list[str]) -> None:
    """``paths`` of the commit, written under ``dest``."""
    archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", "--format=tar", COMMIT, *paths],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", type=Path, required=True, help="a clone or bare mirror of vllm-ascend")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        extract(args.git_dir, tree, ["vllm_ascend"])
        verdicts = run_judge(engine_env().python, all_stack_cases(Path(tmp) / "scripts"), Path(tmp) / "judge",
                             sources=tree)
        refused = sorted(k for k, v in verdicts.items() if not v["ok"])
        if refused:
            print(f"the engine refused {refused}; fix those first", file=sys.stderr)
            return 1
        imports = {name: path for v in verdicts.values() for name, path in v["vllm_ascend_imports"].items()}
        shutil.rmtree(VENDOR / "vllm_ascend", ignore_errors=True)
        extract(args.git_dir, VENDOR, ["LICENSE", *sorted({p for p in imports.values() if p})])
    print(f"vendored {sum(1 for p in set(imports.values()) if p)} files of {COMMIT} into {VENDOR}")
    print("looked for, absent from the tag:", sorted(n for n, p in imports.items() if p is None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
