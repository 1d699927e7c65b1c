#!/usr/bin/env python3
"""Extract the "engine surface" of each supported vLLM-Ascend release from its released sources.

For every release in :data:`RELEASES` this reads the Python sources of vLLM (the wheel) and of
vLLM-Ascend (a wheel, or the upstream git tag when PyPI has no usable wheel) *without importing
them* and writes ``ascend_runtime/engine/surfaces/vllm-ascend-<release>.json``: the ``vllm serve``
flags, environment variables, ``--additional-config`` keys, KV connector registry, expert-map
keys, EPLB policies and Prometheus metrics that release reads. ``--check`` regenerates in memory
and diffs against the committed files.

Usage::

    python tools/engine_surface.py                      # (re)write all data files
    python tools/engine_surface.py --check              # exit 1 with a diff if stale
    python tools/engine_surface.py --release 0.23.0 --wheel-dir /tmp/wheels \
        --vllm-ascend-git DIR

Exit codes: 0 ok / identical, 1 ``--check`` found differences, 2 a source could not be found,
3 an extraction or sanity check failed. Standard library only (plus ``pip`` and ``git``
executables when sources have to be fetched).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _load_rules() -> Any:
    """Import the sibling tools/engine_surface_rules.py by path (tools/ is not a package)."""
    name = "engine_surface_rules"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("engine_surface_rules.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


rules = _load_rules()
SourceTree = rules.SourceTree
ExtractionError = rules.ExtractionError

REPO_ROOT = Path(__file__).resolve().parents[1]
SURFACES_DIR = REPO_ROOT / "ascend_runtime" / "engine" / "surfaces"
#: A local git directory holding vllm-ascend release tags, from $UPSTREAM_MIRRORS/vllm-project+vllm-ascend/repo
#: when that variable names a folder of bare mirrors (unset: --vllm-ascend-git or a fetch from GitHub).
DEFAULT_MIRROR = (Path(os.environ["UPSTREAM_MIRRORS"]) / "vllm-project+vllm-ascend" / "repo"
                  if os.environ.get("UPSTREAM_MIRRORS") else Path("/nonexistent"))
UPSTREAM_GIT_URL = "https://github.com/vllm-project/vllm-ascend.git"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Release:
    """One supported vLLM-Ascend release and where its sources come from."""

    version: str  # vLLM-Ascend version
    vllm_version: str  # paired vLLM (vllm-ascend's Dockerfile ARG VLLM_TAG)
    ascend_source: str  # "wheel" | "git"
    git_tag: str


RELEASES: dict[str, Release] = {
    # PyPI has only an sdist for vllm-ascend 0.23.0 (it does not build off-NPU): read the git tag.
    "0.23.0": Release("0.23.0", "0.23.0", "git", "v0.23.0"),
    # A manylinux wheel exists for 0.11.0; its .py files equal the v0.11.0 tag's vllm_ascend/.
    "0.11.0": Release("0.11.0", "0.11.0", "wheel", "v0.11.0"),
}

# Facts verified by hand against the upstream sources; extraction must reproduce them.
SANITY: dict[str, dict[str, list[str]]] = {
    "0.23.0": {
        "serve_flags": [
            "--host", "--port", "--headless", "--api-server-count", "--served-model-name",
            "--data-parallel-size", "--data-parallel-size-local", "--data-parallel-address",
            "--data-parallel-rpc-port", "--data-parallel-start-rank", "--tensor-parallel-size",
            "--enable-expert-parallel", "--seed", "--max-model-len", "--max-num-seqs",
            "--max-num-batched-tokens", "--gpu-memory-utilization", "--trust-remote-code",
            "--enforce-eager", "--quantization", "--speculative-config", "--kv-transfer-config",
            "--additional-config", "--compilation-config", "--no-enable-prefix-caching",
            "--async-scheduling", "--no-async-scheduling", "--no-enable-expert-parallel",
        ],
        "additional_config:eplb_config": [
            "dynamic_eplb", "expert_map_path", "expert_heat_collection_interval",
            "algorithm_execution_interval", "expert_map_record_path", "num_redundant_experts",
            "eplb_policy_type", "eplb_heat_collection_stage",
        ],
        "additional_config:": [
            "recompute_scheduler_enable", "multistream_overlap_shared_expert", "enable_shared_expert_dp",
            "finegrained_tp_config", "eplb_config", "enable_flashcomm1", "weight_nz_mode",
        ],
        "additional_config:ascend_compilation_config": ["enable_npugraph_ex", "fuse_muls_add"],
        "additional_config:finegrained_tp_config": ["oproj_tensor_parallel_size", "lmhead_tensor_parallel_size"],
        "env_vars": ["VLLM_HOST_IP", "VLLM_ASCEND_ENABLE_NZ", "DYNAMIC_EPLB"],
        "kv_connectors": ["MooncakeConnectorV1", "MooncakeLayerwiseConnector", "NixlConnector", "MultiConnector"],
        "expert_map_keys": ["moe_layer_count", "layer_list", "device_list", "device_expert"],
        "json_option_fields:--kv-transfer-config": [
            "kv_connector", "kv_role", "kv_port", "engine_id", "kv_connector_extra_config", "kv_connector_module_path",
        ],
        "json_option_fields:--speculative-config": ["method", "num_speculative_tokens"],
        "json_option_fields:--compilation-config": ["cudagraph_mode", "cudagraph_capture_sizes"],
        "cudagraph_modes": ["FULL_DECODE_ONLY", "NONE"],
        "speculative_methods": ["mtp", "deepseek_mtp"],
        "speculative_method_rewrites": ["deepseek_mtp"],
        "metrics": [
            "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:time_to_first_token_seconds",
            "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_success",
        ],
    },
    "0.11.0": {
        "serve_flags": [
            "--host", "--port", "--headless", "--api-server-count", "--data-parallel-start-rank",
            "--tensor-parallel-size", "--enable-expert-parallel", "--additional-config",
            "--kv-transfer-config", "--no-enable-prefix-caching", "--guided-decoding-backend",
        ],
        "additional_config:": [
            "torchair_graph_config", "ascend_scheduler_config", "expert_map_path", "dynamic_eplb",
            "init_redundancy_expert",
        ],
        "additional_config:torchair_graph_config": ["enabled", "graph_batch_sizes", "enable_multistream_mla"],
        "additional_config:ascend_scheduler_config": ["enabled", "enable_chunked_prefill", "max_num_batched_tokens"],
        "env_vars": ["VLLM_HOST_IP", "VLLM_ASCEND_ENABLE_MLAPO", "DYNAMIC_EPLB"],
        "kv_connectors": ["LLMDataDistCMgrConnector", "MooncakeConnectorV1", "NixlConnector"],
        "expert_map_keys": ["moe_layer_count", "layer_list", "device_count", "device_list", "device_expert"],
        "json_option_fields:--kv-transfer-config": ["kv_connector", "kv_role", "kv_port", "kv_connector_extra_config"],
        "speculative_methods": ["deepseek_mtp"],
        "metrics": [
            "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:time_to_first_token_seconds",
            "vllm:e2e_request_latency_seconds", "vllm:request_success",
        ],
    },
}


class SourceNotFound(Exception):
    """A source could not be located or fetched; the message names the option to set."""


# --------------------------------------------------------------------------- #
# Obtaining sources
# --------------------------------------------------------------------------- #


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ascend-deploy" / "engine-surface"


def recorded_wheel(release: str, package: str, surfaces_dir: Path) -> str | None:
    """The wheel file name a committed data file says it was built from (to pick the same file)."""
    path = surfaces_dir / f"vllm-ascend-{release}.json"
    if not path.exists():
        return None
    try:
        source = json.loads(path.read_text())["sources"][package]
    except (KeyError, ValueError):
        return None
    match = re.match(r"(\S+\.whl) sha256:", source)
    return match.group(1) if match else None


def _wheel_candidates(directory: Path, dist: str, version: str) -> list[Path]:
    pattern = re.compile(rf"^{re.escape(dist)}-{re.escape(version)}(-\d\w*)?-[^-]+-[^-]+-[^-]+\.whl$")
    return sorted(p for p in directory.glob("*.whl") if pattern.match(p.name)) if directory.is_dir() else []


def _pip_download(requirement: str, dest: Path, recorded: str | None) -> None:
    """``pip download --no-deps REQ -d DEST``, pinned to the recorded wheel's platform tags if known."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", requirement, "-d", str(dest)]
    if recorded:
        parts = recorded[:-4].split("-")
        _, abi, plat = parts[-3], parts[-2], parts[-1]
        cmd += ["--only-binary=:all:", "--implementation", "cp", "--abi", abi]
        for p in plat.split("."):
            cmd += ["--platform", p]
        py = parts[-3]
        if abi != "abi3" and py.startswith("cp") and py[2:].isdigit():
            cmd += ["--python-version", f"{py[2]}.{py[3:]}"]
    dest.mkdir(parents=True, exist_ok=True)
    print(f"  $ {' '.join(cmd[2:])}", flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SourceNotFound(f"pip download of {requirement} failed:\n{result.stderr.strip()}")


def find_wheel(dist: str, version: str, wheel_dir: Path | None, cache_dir: Path, download: bool,
               recorded: str | None) -> Path:
    """Locate (or download) the wheel of ``dist==version``.

    With ``--wheel-dir`` only that directory is searched; otherwise the cache directory, then
    ``pip download --no-deps`` into it. The wheel a committed data file names is preferred.
    """
    directory = wheel_dir if wheel_dir is not None else cache_dir / "wheels"
    candidates = _wheel_candidates(directory, dist, version)
    if not candidates and wheel_dir is None and download:
        requirement = f"{dist.replace('_', '-')}=={version}"
        _pip_download(requirement, directory, recorded)
        candidates = _wheel_candidates(directory, dist, version)
    if recorded:
        for c in candidates:
            if c.name == recorded:
                return c
    if len(candidates) == 1:
        return candidates[0]
    where = f"--wheel-dir {directory}" if wheel_dir is not None else f"the cache {directory}"
    if not candidates:
        hint = f"pip download --no-deps {dist.replace('_', '-')}=={version} -d DIR"
        raise SourceNotFound(f"no {dist} {version} wheel in {where}; run `{hint}` and pass --wheel-dir DIR")
    names = ", ".join(c.name for c in candidates)
    raise SourceNotFound(f"several {dist} {version} wheels in {where} ({names}); keep one or set --wheel-dir")


def read_wheel(path: Path, package: str) -> Any:
    """The ``package/**.py`` members of a wheel, as a SourceTree (zipfile; nothing is installed)."""
    files: dict[str, str] = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.filename.startswith(package + "/") and info.filename.endswith(".py"):
                files[info.filename] = zf.read(info).decode("utf-8")
    if not files:
        raise SourceNotFound(f"{path.name} contains no {package}/ sources")
    return SourceTree(files, label=f"{path.name} sha256:{sha256_file(path)}")


def _git(git_dir: Path, *args: str, input_bytes: bytes | None = None) -> bytes:
    result = subprocess.run(["git", f"--git-dir={git_dir}", *args], input=input_bytes, capture_output=True, check=False)
    if result.returncode != 0:
        raise SourceNotFound(f"git {' '.join(args)} in {git_dir} failed: {result.stderr.decode().strip()}")
    return result.stdout


def _has_tag(git_dir: Path, tag: str) -> bool:
    if not git_dir.exists():
        return False
    result = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", "--verify", "--quiet",
                             f"refs/tags/{tag}^{{commit}}"], capture_output=True, check=False)
    return result.returncode == 0


def _git_dir_of(path: Path) -> Path:
    """Accept a bare repository or a work tree (use its .git)."""
    return path / ".git" if (path / ".git").exists() else path


def find_git(tag: str, git_dir: Path | None, cache_dir: Path, download: bool) -> Path:
    """A git directory holding ``tag``: ``--vllm-ascend-git``, else the local mirror, else a cache
    repository into which the tag is fetched from GitHub."""
    if git_dir is not None:
        resolved = _git_dir_of(git_dir)
        if not _has_tag(resolved, tag):
            raise SourceNotFound(f"--vllm-ascend-git {git_dir} has no tag {tag}")
        return resolved
    if _has_tag(DEFAULT_MIRROR, tag):
        return DEFAULT_MIRROR
    cached = cache_dir / "vllm-ascend.git"
    if not _has_tag(cached, tag) and download:
        if not cached.exists():
            subprocess.run(["git", "init", "--bare", "--quiet", str(cached)], check=True)
        print(f"  $ git --git-dir={cached} fetch --depth 1 {UPSTREAM_GIT_URL} tag {tag}", flush=True)
        result = subprocess.run(["git", f"--git-dir={cached}", "fetch", "--quiet", "--depth", "1",
                                 UPSTREAM_GIT_URL, f"refs/tags/{tag}:refs/tags/{tag}"], capture_output=True, text=True,
                                check=False)
        if result.returncode != 0:
            raise SourceNotFound(f"cannot fetch {tag} from {UPSTREAM_GIT_URL} ({result.stderr.strip()}); "
                                 "set --vllm-ascend-git to a clone that has the tag")
    if not _has_tag(cached, tag):
        raise SourceNotFound(f"no git repository with tag {tag}; set --vllm-ascend-git DIR")
    return cached


def require_upstream(releases: Sequence[Release], git_dir: Path | None, cache_dir: Path, download: bool) -> None:
    """Before any download: every release read from a git tag can get it (a local repository holds the tag,
    or ``git ls-remote`` reaches :data:`UPSTREAM_GIT_URL` and it lists the tag); else SourceNotFound naming
    ``--vllm-ascend-git``. The wheels come first and weigh hundreds of MB, the tag is needed only after them."""
    for release in releases:
        if release.ascend_source != "git":
            continue
        tag = release.git_tag
        if git_dir is not None:
            find_git(tag, git_dir, cache_dir, False)  # raises naming --vllm-ascend-git when the tag is missing
            continue
        if _has_tag(DEFAULT_MIRROR, tag) or _has_tag(cache_dir / "vllm-ascend.git", tag):
            continue
        if not download:
            raise SourceNotFound(f"no git repository with tag {tag} and --no-download; set --vllm-ascend-git DIR")
        print(f"  $ git ls-remote {UPSTREAM_GIT_URL} refs/tags/{tag}", flush=True)
        try:
            result = subprocess.run(["git", "ls-remote", "--exit-code", UPSTREAM_GIT_URL, f"refs/tags/{tag}"],
                                    capture_output=True, text=True, timeout=120, check=False)
            why = result.stderr.strip().splitlines()[-1:] if result.returncode else []
            reached = result.returncode == 0
        except subprocess.TimeoutExpired:
            reached, why = False, ["no answer in 120 s"]
        if not reached:
            raise SourceNotFound(f"cannot read tag {tag} from {UPSTREAM_GIT_URL} ({why[0] if why else 'no such tag'}); "
                                 "nothing was downloaded: set --vllm-ascend-git DIR to a clone or bare mirror "
                                 "holding the tag (docs/engine-surfaces.md), or run where GitHub is reachable")


def read_git_tag(git_dir: Path, tag: str, package: str) -> Any:
    """The ``package/**.py`` blobs at ``tag`` (``git ls-tree`` + ``git cat-file --batch``)."""
    commit = _git(git_dir, "rev-parse", f"refs/tags/{tag}^{{commit}}").decode().strip()
    listing = _git(git_dir, "ls-tree", "-r", "-z", commit, "--", package + "/").decode()
    entries = []
    for line in listing.split("\0"):
        if not line:
            continue
        meta, path = line.split("\t", 1)
        _, kind, sha = meta.split()
        if kind == "blob" and path.endswith(".py"):
            entries.append((path, sha))
    batch = _git(git_dir, "cat-file", "--batch", input_bytes="".join(f"{sha}\n" for _, sha in entries).encode())
    files: dict[str, str] = {}
    stream = io.BytesIO(batch)
    for path, sha in entries:
        header = stream.readline().decode().split()
        if len(header) != 3 or header[0] != sha:
            raise SourceNotFound(f"unexpected git cat-file output for {path}")
        files[path] = stream.read(int(header[2])).decode("utf-8")
        stream.read(1)
    return SourceTree(files, label=f"git tag {tag} commit {commit}")


def dockerfile_vllm_tag(git_dir: Path, tag: str) -> str | None:
    """``ARG VLLM_TAG=...`` in vllm-ascend's Dockerfile at ``tag`` (the paired vLLM version)."""
    try:
        text = _git(git_dir, "show", f"refs/tags/{tag}:Dockerfile").decode()
    except SourceNotFound:
        return None
    match = re.search(r"^ARG\s+VLLM_TAG=(\S+)", text, re.MULTILINE)
    return match.group(1) if match else None


# --------------------------------------------------------------------------- #
# Building a surface
# --------------------------------------------------------------------------- #


def build_surface(release: Release, vllm: Any, ascend: Any) -> dict[str, Any]:
    """Run every rule over the two source trees and assemble the (JSON-ready) data file."""
    flags = rules.extract_serve_flags(vllm, ascend)
    vllm_env = rules.extract_env_table(vllm, "vllm/envs.py")
    ascend_env = rules.extract_env_table(ascend, "vllm_ascend/envs.py")
    direct_env = rules.extract_direct_env_reads(ascend, "vllm_ascend", "vllm_ascend/envs.py", ascend_env)
    addl = rules.extract_additional_config(ascend, vllm)
    registry = rules.extract_kv_connectors(vllm, ascend)
    modules, missing = rules.extract_connector_modules(vllm, ascend, registry.values())
    vllm_registry = {c.name: c for c in rules.register_connector_calls(vllm, "vllm", rules.Workspace(vllm, ascend))}
    expert = rules.extract_expert_map_keys(ascend)
    policies = rules.extract_eplb_policies(ascend)
    options = rules.extract_json_options(vllm, ascend)
    metrics: dict[str, Any] = {}
    skipped: list[str] = []
    for tree, package in ((vllm, "vllm"), (ascend, "vllm_ascend")):
        found, dead = rules.extract_metrics(tree, package)
        skipped += dead
        for name, m in found.items():
            metrics.setdefault(name, m)

    details: dict[str, Any] = {}
    for name, c in sorted(registry.items()):
        entry: dict[str, Any] = {"module": c.module, "class": c.cls, "from": c.origin}
        upstream = vllm_registry.get(name)
        if c.origin == "vllm_ascend" and upstream is not None:
            entry["overrides"] = {"module": upstream.module, "class": upstream.cls}
        details[name] = entry

    return {
        "schema": SCHEMA_VERSION,
        "release": release.version,
        "vllm_version": release.vllm_version,
        "sources": {"vllm": vllm.label, "vllm_ascend": ascend.label},
        "serve_flags": sorted(flags.long),
        "serve_short_flags": sorted(flags.short),
        "serve_flags_deprecated": sorted(flags.deprecated),
        "env_vars": {"vllm": vllm_env, "vllm_ascend": ascend_env, "vllm_ascend_direct": direct_env},
        "env_vars_set_by_vllm_ascend": rules.extract_env_writes(ascend, "vllm_ascend"),
        "additional_config": {k: sorted(v) for k, v in sorted(addl.keys.items())},
        "additional_config_classes": {k: sorted(v) for k, v in sorted(addl.section_classes.items())},
        "additional_config_open_sections": dict(sorted(addl.open_sections.items())),
        "kv_connectors": {name: c.module for name, c in sorted(registry.items())},
        "kv_connector_details": details,
        "kv_connector_missing_modules": missing,
        "connector_modules": modules,
        "expert_map": {
            "read": sorted(expert.read),
            "written": sorted(expert.written),
            "readers": sorted(expert.readers),
            "writers": sorted(expert.writers),
        },
        "eplb_policies": {str(k): v for k, v in sorted(policies.items())},
        "json_option_fields": {flag: names for flag, names in sorted(options.fields.items())},
        "cudagraph_modes": sorted(options.cudagraph_modes),
        "speculative_methods": options.speculative_methods,
        "speculative_method_rewrites": options.speculative_method_rewrites,
        "metrics": {name: m.type for name, m in sorted(metrics.items())},
        "metrics_hidden": sorted(name for name, m in metrics.items() if m.hidden),
        "metric_modules": {name: m.module for name, m in sorted(metrics.items())},
        "metrics_skipped_unreferenced_modules": sorted(skipped),
    }


def render(surface: Mapping[str, Any]) -> str:
    """Deterministic JSON text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(surface, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def sanity_failures(surface: Mapping[str, Any]) -> list[str]:
    """Known facts (:data:`SANITY`) that the extracted surface does not contain."""
    facts = SANITY.get(surface["release"], {})
    env = {n for names in surface["env_vars"].values() for n in names}
    expert = set(surface["expert_map"]["read"]) | set(surface["expert_map"]["written"])
    failures = []
    for key, expected in facts.items():
        if key.startswith("additional_config:"):
            have = set(surface["additional_config"].get(key.split(":", 1)[1], []))
        elif key == "env_vars":
            have = env
        elif key == "expert_map_keys":
            have = expert
        elif key.startswith("json_option_fields:"):
            have = set(surface["json_option_fields"].get(key.split(":", 1)[1], []))
        else:
            have = set(surface[key])
        failures += [f"{key}: {item}" for item in expected if item not in have]
    return failures


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #


def load_sources(release: Release, args: argparse.Namespace, surfaces_dir: Path) -> tuple[Any, Any]:
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    wheel_dir = Path(args.wheel_dir) if args.wheel_dir else None
    download = not args.no_download
    tag = f"[{release.version}]"

    vllm_whl = find_wheel("vllm", release.vllm_version, wheel_dir, cache, download,
                          recorded_wheel(release.version, "vllm", surfaces_dir))
    vllm = read_wheel(vllm_whl, "vllm")
    print(f"{tag} vllm {release.vllm_version}: {vllm.label} ({len(vllm.paths())} .py files)", flush=True)

    git_dir: Path | None = None
    if release.ascend_source == "git":
        git_dir = find_git(release.git_tag, Path(args.vllm_ascend_git) if args.vllm_ascend_git else None,
                           cache, download)
        ascend = read_git_tag(git_dir, release.git_tag, "vllm_ascend")
    else:
        whl = find_wheel("vllm_ascend", release.version, wheel_dir, cache, download,
                         recorded_wheel(release.version, "vllm_ascend", surfaces_dir))
        ascend = read_wheel(whl, "vllm_ascend")
        if args.vllm_ascend_git or _has_tag(DEFAULT_MIRROR, release.git_tag):
            try:
                git_dir = find_git(release.git_tag, Path(args.vllm_ascend_git) if args.vllm_ascend_git else None,
                                   cache, False)
            except SourceNotFound:
                git_dir = None
    print(f"{tag} vllm_ascend {release.version}: {ascend.label} ({len(ascend.paths())} .py files)", flush=True)

    if git_dir is not None:
        paired = dockerfile_vllm_tag(git_dir, release.git_tag)
        if paired is not None and paired.lstrip("v") != release.vllm_version:
            raise SourceNotFound(f"vllm-ascend {release.git_tag} Dockerfile pairs vLLM {paired}, "
                                 f"not {release.vllm_version}; fix RELEASES")
        print(f"{tag} pairing: Dockerfile ARG VLLM_TAG={paired}", flush=True)
    return vllm, ascend


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", action="append", choices=sorted(RELEASES),
                        help="only this release (repeatable; default: all)")
    parser.add_argument("--check", action="store_true",
                        help="regenerate in memory, print a unified diff and exit 1 if the committed files differ")
    parser.add_argument("--wheel-dir", help="directory holding the vllm (and vllm_ascend) wheels; "
                        "default: a cache dir filled with `pip download --no-deps`")
    parser.add_argument("--vllm-ascend-git", help=f"git directory with vllm-ascend tags (default: {DEFAULT_MIRROR}, "
                        "else fetched from GitHub into the cache)")
    parser.add_argument("--cache-dir", help=f"download cache (default: {default_cache_dir()})")
    parser.add_argument("--no-download", action="store_true", help="never run pip download / git fetch")
    parser.add_argument("--surfaces-dir", default=str(SURFACES_DIR), help="where the data files live")
    args = parser.parse_args(argv)

    surfaces_dir = Path(args.surfaces_dir)
    releases = args.release or sorted(RELEASES, key=lambda v: tuple(int(p) for p in v.split(".")))
    stale = False
    try:  # before the first wheel download: the upstream tag is needed after hundreds of MB of wheels
        require_upstream([RELEASES[v] for v in releases], Path(args.vllm_ascend_git) if args.vllm_ascend_git else None,
                         Path(args.cache_dir) if args.cache_dir else default_cache_dir(), not args.no_download)
    except SourceNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for version in releases:
        release = RELEASES[version]
        try:
            vllm, ascend = load_sources(release, args, surfaces_dir)
        except SourceNotFound as exc:
            print(f"error: [{version}] {exc}", file=sys.stderr)
            return 2
        try:
            surface = build_surface(release, vllm, ascend)
        except ExtractionError as exc:
            print(f"error: [{version}] extraction failed: {exc}", file=sys.stderr)
            return 3
        failures = sanity_failures(surface)
        if failures:
            print(f"error: [{version}] sanity facts missing from the extraction:", file=sys.stderr)
            for f in failures:
                print(f"  {f}", file=sys.stderr)
            return 3
        text = render(surface)
        target = surfaces_dir / f"vllm-ascend-{version}.json"
        summary = ", ".join(f"{k}={_count(surface[k])}" for k in (
            "serve_flags", "env_vars", "additional_config", "kv_connectors", "connector_modules", "metrics"))
        if args.check:
            old = target.read_text() if target.exists() else ""
            if old == text:
                print(f"[{version}] {target.name} is up to date ({summary})", flush=True)
            else:
                stale = True
                rel = _display(target)
                sys.stdout.writelines(difflib.unified_diff(
                    old.splitlines(keepends=True), text.splitlines(keepends=True),
                    fromfile=f"a/{rel}", tofile=f"b/{rel} (regenerated)"))
                print(f"[{version}] {target.name} differs from its sources", flush=True)
        else:
            surfaces_dir.mkdir(parents=True, exist_ok=True)
            changed = not target.exists() or target.read_text() != text
            target.write_text(text)
            print(f"[{version}] {'wrote' if changed else 'unchanged'} {_display(target)} ({summary})", flush=True)
    return 1 if stale else 0


def _count(value: Any) -> int:
    """Entries in a field: list length, or the summed lengths of a dict of lists."""
    if isinstance(value, Mapping) and value and all(isinstance(v, list) for v in value.values()):
        return sum(len(v) for v in value.values())
    return len(value)


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
