"""A corpus of bad stacks and inventories, generated from the committed stacks by mutation.

Each :class:`Case` names its class (what kind of value is wrong), the committed
stack it starts from, one mutation (of the stack's ``config:``, of its
inventory, or of the files themselves) and the key path the error must name.
:func:`build` writes the mutated stack into a fresh stacks directory;
:func:`run_cli` runs ``ascend-deploy`` in this process (the CLI's own
``main``), so the whole corpus runs in one interpreter.

``python -m tests.config.corpus`` prints the corpus size per class.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

from ascend_runtime.cli import main

STACKS = Path(__file__).resolve().parents[2] / "stacks"
NS = "ascend-deepseek:"
#: Planted in files used as inventories; it must never appear in an error.
MARKER = "CORPUS-MARKER-do-not-print-5e1f0c"
DELETE = object()

Edit = Callable[[dict[str, Any]], None]
FileEdit = Callable[[Path, Path], None]  # (stack file, inventory file)


@dataclass(frozen=True)
class Case:
    """One bad input: its class, label, base stack, mutation and the key path the error names."""

    cls: str
    label: str
    stack: str
    path: str
    config: Edit | None = None
    inventory: Edit | None = None
    files: FileEdit | None = None
    patch: Callable[[Path], contextlib.AbstractContextManager[Any]] | None = None
    fragments: tuple[str, ...] = field(default=())
    stack_arg: str | None = None  # the --stack argument, when not the base stack's name

    @property
    def id(self) -> str:
        return f"{self.cls}:{self.label}"


# --- mutation helpers ---------------------------------------------------------------------------

_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _tokens(path: str) -> list[str | int]:
    return [int(i) if i else name for name, i in _TOKEN.findall(path)]


def _assign(doc: Any, tokens: list[str | int], value: Any) -> None:
    for token in tokens[:-1]:
        doc = doc.setdefault(token, {}) if isinstance(token, str) and isinstance(doc, dict) else doc[token]
    if value is DELETE:
        del doc[tokens[-1]]
    else:
        doc[tokens[-1]] = copy.deepcopy(value)


def cfg(path: str, value: Any) -> Edit:
    """Set ``section.key...`` of the project namespace (``DELETE`` removes it)."""
    section, _, rest = path.partition(".")

    def edit(config: dict[str, Any]) -> None:
        _assign(config, [NS + section, *_tokens(rest)] if rest else [NS + section], value)

    return edit


def raw(key: str, value: Any) -> Edit:
    """Set a config key exactly as written (another namespace, a typo)."""

    def edit(config: dict[str, Any]) -> None:
        config[key] = copy.deepcopy(value)

    return edit


def rename(old: str, new: str) -> Edit:
    """Move the raw config key ``old`` to ``new``."""

    def edit(config: dict[str, Any]) -> None:
        config[new] = config.pop(old)

    return edit


def inv(path: str, value: Any) -> Edit:
    """Set an inventory value by path (``nodes[2].devices[3].device_ip``)."""

    def edit(doc: dict[str, Any]) -> None:
        _assign(doc, _tokens(path), value)

    return edit


def chain(*edits: Edit) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        for e in edits:
            e(doc)

    return edit


def every_device(key: str, value: Any) -> Edit:
    def edit(doc: dict[str, Any]) -> None:
        for node in doc["nodes"]:
            for dev in node["devices"]:
                if value is DELETE:
                    dev.pop(key, None)
                else:
                    dev[key] = value

    return edit


def write_inventory_text(text: str | bytes) -> FileEdit:
    def edit(_stack: Path, inventory: Path) -> None:
        if isinstance(text, bytes):
            inventory.write_bytes(text)
        else:
            inventory.write_text(text, encoding="utf-8")

    return edit


def write_stack_text(text: str | bytes) -> FileEdit:
    def edit(stack: Path, _inventory: Path) -> None:
        if isinstance(text, bytes):
            stack.write_bytes(text)
        else:
            stack.write_text(text, encoding="utf-8")

    return edit


def inventory_is(kind: str) -> FileEdit:
    """Replace the inventory file by a directory, a FIFO, or a symlink out of the stacks directory."""

    def edit(_stack: Path, inventory: Path) -> None:
        inventory.unlink()
        if kind == "dir":
            inventory.mkdir()
        elif kind == "fifo":
            os.mkfifo(inventory)
        elif kind == "symlink-out":
            outside = inventory.parents[2] / f"outside-{inventory.name}"
            outside.write_text(f"nodes: []\n# {MARKER}\n", encoding="utf-8")
            inventory.symlink_to(outside)
        elif kind == "dangling":
            inventory.symlink_to(inventory.parent / "missing.yaml")

    return edit


def planted(name: str, text: str) -> FileEdit:
    """A file holding ``text`` (with the marker) under stacks/inventories/, made the stack's inventory."""

    def edit(stack: Path, _inventory: Path) -> None:
        (stack.parent / "inventories" / name).write_text(text, encoding="utf-8")
        doc = yaml.safe_load(stack.read_text(encoding="utf-8"))
        doc["config"][NS + "inventory"] = f"inventories/{name}"
        stack.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")

    return edit


def unreadable(target: str) -> Callable[[Path], contextlib.AbstractContextManager[Any]]:
    """Reading the stack or inventory file fails with EACCES (tests may run as root, so it is patched)."""

    def patch(stacks: Path) -> contextlib.AbstractContextManager[Any]:
        original = os.open

        def opener(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            file = Path(os.fsdecode(path))
            if (target == "stack" and file.name.startswith("Pulumi.")) or (target == "inventory" and "inventories" in file.parts):
                raise PermissionError(13, "Permission denied", str(file))
            return original(path, flags, *args, **kwargs)

        return mock.patch.object(os, "open", opener)  # the kit's reading door opens files with os.open

    return patch


PRIVATE_KEY = f"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n{MARKER}\n-----END OPENSSH PRIVATE KEY-----\n"
PASSWD = f"{MARKER}:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n{MARKER}:x:1000:1000::/home/m:/bin/sh\n"
NOTES = f"{MARKER}\nnot an inventory, a file of notes: {MARKER}\n"


# --- the corpus ---------------------------------------------------------------------------------


def _names() -> list[Case]:
    c = "names"
    bad_nodes = {
        "uppercase": "A2-Node-01", "underscore": "a2_node_01", "unicode": "a2-nöde-01", "64-chars": "n" * 64,
        "escape": "../../escape", "slash": "nodes/a2", "leading-dash": "-a2-node", "space": "a2 node", "empty": "",
        "trailing-dot": "a2-node.",
    }
    cases = [Case(c, f"node-{k}", "a2-staging", "inventory.nodes[1].name", inventory=inv("nodes[1].name", v))
             for k, v in bad_nodes.items()]
    cases.append(Case(c, "node-escape-local", "local", "inventory.nodes[0].name", inventory=inv("nodes[0].name", "../../escape")))
    for k, v in {"uppercase": "DeepSeek", "underscore": "deep_seek", "dot": "deep.seek", "64-chars": "d" * 64,
                 "unicode": "déepseek", "empty": ""}.items():
        cases.append(Case(c, f"namespace-{k}", "a2-staging", "kubernetes.namespace", config=cfg("kubernetes.namespace", v)))
    cases += [
        Case(c, "monitoring-namespace", "a2-staging", "kubernetes.monitoring_namespace",
             config=cfg("kubernetes.monitoring_namespace", "Monitoring")),
        Case(c, "pvc-name", "cm384-prod", "kubernetes.model_pvc_name", config=cfg("kubernetes.model_pvc_name", "DeepSeek_R1")),
        Case(c, "runtime-class", "cm384-prod", "kubernetes.runtime_class", config=cfg("kubernetes.runtime_class", "Ascend Runtime")),
        Case(c, "runtime-class-handler", "a2-staging", "kubernetes.runtime_class_handler",
             config=cfg("kubernetes.runtime_class_handler", "ascend.v1")),
        Case(c, "npu-resource-no-domain", "a2-staging", "kubernetes.npu_resource", config=cfg("kubernetes.npu_resource", "Ascend910")),
        Case(c, "npu-resource-k8s-domain", "a2-staging", "kubernetes.npu_resource",
             config=cfg("kubernetes.npu_resource", "kubernetes.io/npu")),
        Case(c, "engine-image-uppercase", "a2-staging", "engine.image", config=cfg("engine.image", "Quay.io/Ascend/VLLM:latest tag")),
        Case(c, "runtime-image-space", "a2-staging", "kubernetes.runtime_image", config=cfg("kubernetes.runtime_image", "runtime image")),
        Case(c, "simulator-image", "kind", "simulator.image", config=cfg("simulator.image", "Sim:dev")),
        Case(c, "nic-slash", "a2-staging", "inventory.nodes[0].nic", inventory=inv("nodes[0].nic", "../eth0")),
        Case(c, "nic-too-long", "a2-staging", "inventory.nodes[0].nic", inventory=inv("nodes[0].nic", "enp189s0f0np0abcdef")),
        Case(c, "ssh-user", "a2-staging", "inventory.ssh.user", inventory=inv("ssh.user", "root; rm -rf /")),
        Case(c, "ssh-host", "a2-staging", "inventory.nodes[2].ssh_host", inventory=inv("nodes[2].ssh_host", "host name")),
        Case(c, "jump-host", "cm384-prod", "inventory.ssh.jump_host", inventory=inv("ssh.jump_host", "ops@bastion:99999")),
        Case(c, "model-name-space", "a2-staging", "model.name", config=cfg("model.name", "deepseek r1")),
        Case(c, "stack-name-uppercase", "a2-staging", "stack", stack_arg="A2-Staging"),
        Case(c, "stack-name-escape", "a2-staging", "stack", stack_arg="../stacks/a2-staging"),
    ]
    return cases


def _env_names() -> list[Case]:
    c = "env-names"
    names = {"leading-digit": "1VAR", "dash": "MY-VAR", "space": "MY VAR", "unicode": "ÄNV", "dot": "MY.VAR", "empty": ""}
    return [Case(c, k, "a2-staging", f"engine.extra_env.{v}", config=cfg("engine.extra_env", {"OK_VAR": "1", v: "x"}))
            for k, v in names.items()]


def _paths() -> list[Case]:
    c = "paths"
    weights = {"relative": "data/models/R1", "root": "/", "parent-root": "/models", "dotdot": "/data/../etc/R1",
               "double-slash": "/data//models/R1", "trailing-slash": "/data/models/R1/", "parent-etc": "/etc/R1",
               "parent-usr": "/usr/R1", "space": "/data/my models/R1", "shell": "/data/models/$(reboot)"}
    cases = [Case(c, f"weights-{k}", "a2-staging", "model.weights_path", config=cfg("model.weights_path", v))
             for k, v in weights.items()]
    host = {"relative": "data/models", "root": "/", "etc": "/etc", "proc": "/proc", "dotdot": "/data/../var", "dot": "/data/./models"}
    cases += [Case(c, f"host-path-{k}", "a2-staging", "kubernetes.model_host_path", config=cfg("kubernetes.model_host_path", v))
              for k, v in host.items()]
    cases += [
        Case(c, "staging-dir-relative", "a2-staging", "model_staging.dir", config=cfg("model_staging", {"dir": "models", "files": {}})),
        Case(c, "staging-dir-root", "a2-staging", "model_staging.dir", config=cfg("model_staging", {"dir": "/", "files": {}})),
        Case(c, "staging-file-escape", "a2-staging", "model_staging.files.../../etc/shadow",
             config=cfg("model_staging", {"dir": "/data/models/R1", "files": {"../../etc/shadow": 1}})),
        Case(c, "staging-file-absolute", "a2-staging", "model_staging.files./etc/shadow",
             config=cfg("model_staging", {"dir": "/data/models/R1", "files": {"/etc/shadow": 1}})),
        Case(c, "inventory-absolute", "a2-staging", "inventory", config=cfg("inventory", "/etc/passwd")),
        Case(c, "inventory-home", "a2-staging", "inventory", config=cfg("inventory", "~/.ssh/id_ed25519")),
        Case(c, "inventory-escape", "a2-staging", "inventory", config=cfg("inventory", "../../../../etc/passwd")),
        Case(c, "inventory-symlink-out", "a2-staging", "inventory", files=inventory_is("symlink-out")),
    ]
    return cases


def _files() -> list[Case]:
    c = "files"
    return [
        Case(c, "inventory-directory", "a2-staging", "inventory", files=inventory_is("dir"), fragments=("directory",)),
        Case(c, "inventory-fifo", "a2-staging", "inventory", files=inventory_is("fifo"), fragments=("regular file",)),
        Case(c, "inventory-dangling-symlink", "a2-staging", "inventory", files=inventory_is("dangling"), fragments=("not found",)),
        Case(c, "inventory-missing", "a2-staging", "inventory", config=cfg("inventory", "inventories/nope.yaml")),
        Case(c, "inventory-not-utf8", "a2-staging", "inventory",
             files=write_inventory_text(b"nodes:\n- name: a2-node-01\n  nic: \xff\xfe\n"), fragments=("UTF-8", "line 3")),
        Case(c, "stack-not-utf8", "a2-staging", "stack", files=write_stack_text(b"config:\n  ascend-deepseek:hardware: \xe9\n"),
             fragments=("UTF-8", "line 2")),
        Case(c, "inventory-unreadable", "a2-staging", "inventory", patch=unreadable("inventory"), fragments=("permission denied",)),
        Case(c, "stack-unreadable", "a2-staging", "stack", patch=unreadable("stack"), fragments=("permission denied",)),
        Case(c, "inventory-yaml-syntax", "a2-staging", "inventory",
             files=write_inventory_text("ssh:\n  user: root\nnodes:\n  - name: [a2-node-01\n"), fragments=("line ",)),
        Case(c, "stack-yaml-syntax", "a2-staging", "stack",
             files=write_stack_text("config:\n  ascend-deepseek:hardware: cm384\n\tascend-deepseek:target: local\n"),
             fragments=("line 3",)),
        Case(c, "inventory-empty", "a2-staging", "inventory", files=write_inventory_text(""), fragments=("empty",)),
        Case(c, "inventory-only-comments", "a2-staging", "inventory", files=write_inventory_text("# nothing\n"), fragments=("empty",)),
        Case(c, "stack-empty", "a2-staging", "stack", files=write_stack_text(""), fragments=("empty",)),
        Case(c, "inventory-list", "a2-staging", "inventory", files=write_inventory_text("- a\n- b\n"), fragments=("mapping",)),
        Case(c, "inventory-scalar", "a2-staging", "inventory", files=write_inventory_text("just text\n"), fragments=("mapping",)),
        Case(c, "stack-list", "a2-staging", "stack", files=write_stack_text("- config\n"), fragments=("mapping",)),
        Case(c, "stack-config-list", "a2-staging", "config", files=write_stack_text("config:\n- a\n"), fragments=("mapping",)),
        Case(c, "stack-no-config", "a2-staging", "config", files=write_stack_text("secretsprovider: passphrase\n")),
        Case(c, "inventory-private-key", "a2-staging", "inventory", files=planted("id_ed25519", PRIVATE_KEY)),
        Case(c, "inventory-passwd-copy", "a2-staging", "inventory", files=planted("passwd", PASSWD)),
        Case(c, "inventory-notes", "a2-staging", "inventory", files=planted("notes.txt", NOTES)),
        Case(c, "inventory-marker-in-bad-yaml", "a2-staging", "inventory",
             files=planted("broken.yaml", f"nodes:\n  - name: x\n    host_ip: {MARKER}: [\n")),
        Case(c, "inventory-nested-too-deep", "a2-staging", "inventory",
             files=write_inventory_text("nodes: " + "[" * 5000 + "]" * 5000 + "\n"), fragments=("nested",)),
        Case(c, "inventory-multi-document", "a2-staging", "inventory",
             files=write_inventory_text("nodes: []\n---\nnodes: []\n"), fragments=("line 2",)),
    ]


def _ips() -> list[Case]:
    c = "ips"
    host = {"unspecified": "0.0.0.0", "broadcast": "255.255.255.255", "multicast": "224.0.0.251", "link-local": "169.254.10.1",
            "reserved": "240.0.0.1", "this-network": "0.1.2.3", "loopback-on-kubernetes": "127.0.0.1",
            "not-an-ip": "a2-node-01", "octet-300": "192.0.2.300", "number": 3221225995, "ipv6": "2001:db8::1"}
    cases = [Case(c, f"host-{k}", "a2-staging", "inventory.nodes[2].host_ip", inventory=inv("nodes[2].host_ip", v))
             for k, v in host.items()]
    cases += [
        Case(c, "host-loopback-on-kind", "kind", "inventory.nodes[0].host_ip", inventory=inv("nodes[0].host_ip", "127.0.0.2")),
        Case(c, "host-not-loopback-on-local", "local", "inventory.nodes[3].host_ip", inventory=inv("nodes[3].host_ip", "192.0.2.50")),
        Case(c, "host-unspecified-on-local", "local", "inventory.nodes[0].host_ip", inventory=inv("nodes[0].host_ip", "0.0.0.0")),
    ]
    dev = "nodes[1].devices[3]"
    for k, v in {"loopback": "127.0.0.5", "unspecified": "0.0.0.0", "multicast": "239.1.1.1", "link-local": "169.254.0.9"}.items():
        cases.append(Case(c, f"device-{k}", "a2-staging", f"inventory.{dev}.device_ip", inventory=inv(f"{dev}.device_ip", v)))
    cases += [
        Case(c, "device-network-address", "a2-staging", f"inventory.{dev}.device_ip", inventory=inv(f"{dev}.device_ip", "198.51.100.0")),
        Case(c, "device-broadcast-address", "a2-staging", f"inventory.{dev}.device_ip", inventory=inv(f"{dev}.device_ip", "198.51.100.255")),
        Case(c, "gateway-outside-subnet", "a2-staging", f"inventory.{dev}.gateway", inventory=inv(f"{dev}.gateway", "198.51.101.1")),
        Case(c, "gateway-is-device", "a2-staging", f"inventory.{dev}.gateway", inventory=inv(f"{dev}.gateway", "198.51.100.21")),
        Case(c, "gateway-unspecified", "a2-staging", f"inventory.{dev}.gateway", inventory=inv(f"{dev}.gateway", "0.0.0.0")),
        Case(c, "gateway-without-netmask", "a2-staging", f"inventory.{dev}.netmask", inventory=inv(f"{dev}.netmask", DELETE)),
        Case(c, "netmask-not-contiguous", "a2-staging", f"inventory.{dev}.netmask", inventory=inv(f"{dev}.netmask", "255.0.255.0")),
        Case(c, "netmask-32", "a2-staging", f"inventory.{dev}.netmask", inventory=inv(f"{dev}.netmask", "255.255.255.255")),
        Case(c, "netmask-zero", "a2-staging", f"inventory.{dev}.netmask", inventory=inv(f"{dev}.netmask", "0.0.0.0")),
        Case(c, "netdetect-multicast", "a2-staging", f"inventory.{dev}.netdetect", inventory=inv(f"{dev}.netdetect", "224.0.0.1")),
        Case(c, "subnet-other-gateway", "a2-staging", f"inventory.{dev}.gateway", inventory=inv(f"{dev}.gateway", "198.51.100.2")),
        Case(c, "subnet-overlapping-netmask", "a2-staging", f"inventory.{dev}.netmask", inventory=inv(f"{dev}.netmask", "255.255.0.0")),
        Case(c, "plane-other-subnet-on-link", "a2-staging", f"inventory.{dev}.device_ip",
             inventory=chain(every_device("gateway", DELETE), inv(f"{dev}.device_ip", "203.0.113.5"))),
        Case(c, "device-is-a-host-ip", "a2-staging", f"inventory.{dev}.device_ip",
             inventory=chain(inv(f"{dev}.netmask", DELETE), inv(f"{dev}.gateway", DELETE), inv(f"{dev}.netdetect", DELETE),
                             inv(f"{dev}.device_ip", "192.0.2.11"))),
        Case(c, "device-ip-duplicate", "a2-staging", f"inventory.{dev}.device_ip", inventory=inv(f"{dev}.device_ip", "198.51.100.10")),
        Case(c, "host-ip-duplicate", "a2-staging", "inventory.nodes[2].host_ip", inventory=inv("nodes[2].host_ip", "192.0.2.11")),
        Case(c, "vnic-is-other-device-ip", "cm384-prod", "inventory.nodes[0].devices[0].device_ip",
             inventory=inv("nodes[1].devices[2].vnic_ip", "198.51.100.1")),
    ]
    return cases


def _ports() -> list[Case]:
    c = "ports"
    cases = []
    for key, value, label in [
        ("api_base", 80, "privileged"), ("api_base", 10250, "kubelet"), ("api_base", 10255, "kubelet-read-only"),
        ("dp_rpc_base", 10256, "kube-proxy-healthz"), ("dp_rpc_base", 10249, "kube-proxy-metrics"),
        ("proxy", 2379, "etcd"), ("proxy", 2380, "etcd-peer"), ("balancer_metrics", 6443, "api-server"),
        ("kv_base", 30000, "nodeport-start"), ("kv_base", 32000, "nodeport-inside"), ("kv_base", 10210, "kv-range-covers-kubelet"),
        ("proxy", 10259, "scheduler"), ("api_base", 65535, "past-65535"), ("kv_base", 8001, "collides-api"),
        ("balancer_metrics", 9000, "collides-proxy"), ("api_base", 0, "zero"), ("api_base", True, "bool"), ("api_base", "8000", "string"),
    ]:
        cases.append(Case(c, label, "a2-staging", f"ports.{key}", config=cfg(f"ports.{key}", value)))
    cases += [
        Case(c, "local-kubelet", "local", "ports.api_base", config=cfg("ports.api_base", 10250)),
        Case(c, "kind-nodeport", "kind", "ports.proxy", config=cfg("ports.proxy", 30080)),
        Case(c, "ssh-port-bool", "a2-staging", "inventory.ssh.port", inventory=inv("ssh.port", True)),
        Case(c, "node-ssh-port-zero", "a2-staging", "inventory.nodes[0].ssh_port", inventory=inv("nodes[0].ssh_port", 0)),
    ]
    return cases


def _types() -> list[Case]:
    c = "types"
    cases = [Case(c, label, "a2-staging", key, config=cfg(key, value)) for label, key, value in [
        ("tp-true", "decode.tp", True), ("tp-string", "prefill.tp", "8"), ("dp-float", "decode.dp", 32.0),
        ("mtp-string", "prefill.mtp", "yes"), ("mtp-int", "decode.mtp", 1), ("gpu-util-string", "decode.gpu_memory_utilization", "0.9"),
        ("k8s-version-float", "kubernetes.version", 1.3), ("engine-version-float", "engine.vllm_ascend_version", 0.23),
        ("instances-null", "decode.instances", None), ("taint-string", "kubernetes.taint_nodes", "false"),
        ("graph-sizes-zero", "decode.graph_capture_sizes", [0, 8]), ("graph-sizes-dupe", "decode.graph_capture_sizes", [8, 8]),
        ("slo-bool", "slo.ttft_ms", True), ("stage-list", "prefill", [1, 2]), ("hardware-int", "hardware", 384),
        ("min-goodput-string", "throughput_check.min_goodput", "0.5"),
    ]]
    cases += [
        Case(c, "device-id-bool", "a2-staging", "inventory.nodes[0].devices[1].device_id", inventory=inv("nodes[0].devices[1].device_id", True)),
        Case(c, "super-pod-id-string", "cm384-prod", "inventory.nodes[0].devices[1].super_pod_id",
             inventory=inv("nodes[0].devices[1].super_pod_id", "0")),
        Case(c, "sudo-string", "a2-staging", "inventory.ssh.sudo", inventory=inv("ssh.sudo", "no")),
        Case(c, "nodes-mapping", "a2-staging", "inventory.nodes", inventory=inv("nodes", {"a2-node-01": {}})),
        Case(c, "devices-string", "a2-staging", "inventory.nodes[0].devices", inventory=inv("nodes[0].devices", "all")),
    ]
    return cases


def _model() -> list[Case]:
    c = "model"
    cases = [Case(c, label, "a2-staging", key, config=cfg(key, value)) for label, key, value in [
        ("dense-over-layers", "model.num_dense_layers", 62), ("dense-equals-layers", "model.num_dense_layers", 61),
        ("topk-over-experts", "model.experts_per_token", 300), ("groups-not-dividing", "model.num_expert_groups", 7),
        ("groups-over-experts", "model.num_expert_groups", 512), ("kv-bytes-3", "model.kv_cache_dtype_bytes", 3),
        ("context-over-max", "decode.context_len", 65536),
    ]]
    cases.append(Case(c, "heads-not-divisible-by-tp", "a2-staging", "prefill.tp", config=cfg("model.num_attention_heads", 100)))
    return cases


def _keys() -> list[Case]:
    c = "keys"
    typos = ["ascend-deepsek", "Ascend-DeepSeek", "ascend_deepseek", "ascend-deepseeek", "asccend-deepseek", "ascend-deepseek-",
             "ascnd-depseek"]
    cases = [Case(c, f"namespace-{t}", "a2-staging", f"{t}:throughput_check",
                  config=rename(NS + "throughput_check", f"{t}:throughput_check")) for t in typos]
    cases.append(Case(c, "namespace-typo-local", "local", "ascend-deepsek:slo", config=rename(NS + "slo", "ascend-deepsek:slo")))
    cases += [
        Case(c, "no-namespace", "a2-staging", "hardware", config=rename(NS + "hardware", "hardware")),
        Case(c, "top-level-typo", "a2-staging", "hardwre", config=raw(NS + "hardwre", "cm384")),
        Case(c, "stage-typo", "a2-staging", "decode.tpp", config=cfg("decode.tpp", 1), fragments=("did you mean 'tp'",)),
        Case(c, "kubernetes-typo", "a2-staging", "kubernetes.namespce", config=cfg("kubernetes.namespce", "x")),
        Case(c, "model-typo", "a2-staging", "model.weight_path", config=cfg("model.weight_path", "/data/models/x")),
        Case(c, "eplb-typo", "a2-staging", "prefill.eplb.polcy", config=cfg("prefill.eplb.polcy", "default")),
        Case(c, "node-typo", "a2-staging", "inventory.nodes[0].hostip", inventory=inv("nodes[0].hostip", "192.0.2.99")),
        Case(c, "device-typo", "a2-staging", "inventory.nodes[0].devices[0].deviceip",
             inventory=inv("nodes[0].devices[0].deviceip", "198.51.100.99")),
        Case(c, "ssh-typo", "a2-staging", "inventory.ssh.usr", inventory=inv("ssh.usr", "root")),
        Case(c, "inventory-top-typo", "a2-staging", "inventory.node", inventory=inv("node", [])),
        Case(c, "stack-file-top-typo", "a2-staging", "confg", files=write_stack_text("confg: {}\nconfig: {}\n")),
        Case(c, "duplicate-stack-key", "a2-staging", "decode.tp",
             files=lambda stack, _inv: stack.write_text(stack.read_text().replace("    tp: 1\n", "    tp: 1\n    tp: 2\n"))),
        Case(c, "duplicate-inventory-key", "a2-staging", "inventory.nodes[0].host_ip",
             files=lambda _s, inventory: inventory.write_text(
                 inventory.read_text().replace("  host_ip: 192.0.2.11\n", "  host_ip: 192.0.2.11\n  host_ip: 192.0.2.99\n"))),
        Case(c, "plaintext-secret", "a2-staging", "image_pull_credentials", config=raw(NS + "image_pull_credentials", "hunter2")),
    ]
    return cases


def _runtime_image() -> list[Case]:
    """The kit's runtime image: the kubernetes target pulls it from a registry (config/runtime_image.py)."""
    c = "runtime-image"
    key = "kubernetes.runtime_image"
    build = {"registry": "swr.cn-north-4.myhuaweicloud.com", "repository": "ascend-deepseek/ascend-deploy-runtime"}
    fix = ("build", "REGISTRY/REPOSITORY@sha256:")
    return [
        Case(c, "bare-name-tag", "a2-staging", key, config=cfg(key, "ascend-deploy-runtime:0.1.0"), fragments=fix),
        Case(c, "bare-name-tag-cm384", "cm384-prod", key, config=cfg(key, "ascend-deploy-runtime:0.1.0"), fragments=fix),
        Case(c, "bare-name-digest", "cm384-prod", key, config=cfg(key, "ascend-deploy-runtime@sha256:" + "a" * 64),
             fragments=fix),
        Case(c, "docker-hub-namespace", "a2-staging", key, config=cfg(key, "ascend/ascend-deploy-runtime:0.1.0"),
             fragments=fix),
        Case(c, "unset", "cm384-prod", key, config=cfg(key, DELETE), fragments=fix),
        Case(c, "build-registry-no-host", "a2-staging", f"{key}.build.registry",
             config=cfg(key, {"build": {**build, "registry": "ascend-deepseek"}})),
        Case(c, "build-repository-uppercase", "a2-staging", f"{key}.build.repository",
             config=cfg(key, {"build": {**build, "repository": "Ascend/Runtime"}})),
        Case(c, "build-tag-space", "cm384-prod", f"{key}.build.tag", config=cfg(key, {"build": {**build, "tag": "0.1 rc"}})),
        Case(c, "build-platform", "a2-staging", f"{key}.build.platforms[0]",
             config=cfg(key, {"build": {**build, "platforms": ["linux/s390x"]}})),
        Case(c, "build-unknown-key", "kind", f"{key}.build.registery",
             config=cfg(key, {"build": {**build, "registery": "localhost:5001"}}), fragments=("registry",)),
        Case(c, "build-missing-registry", "kind", f"{key}.build.registry",
             config=cfg(key, {"build": {"repository": "ascend-deploy-runtime"}})),
        Case(c, "plaintext-registry-password", "a2-staging", "runtime_image_registry_password",
             config=raw(NS + "runtime_image_registry_password", "hunter2"), fragments=("pulumi config set --secret",)),
    ]


def all_cases() -> list[Case]:
    """Every case of the corpus, by class."""
    cases = [*_names(), *_env_names(), *_paths(), *_files(), *_ips(), *_ports(), *_types(), *_model(), *_keys(),
             *_runtime_image()]
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids)), "case labels must be unique"
    return cases


def sizes(cases: list[Case]) -> Counter[str]:
    """Cases per class."""
    return Counter(case.cls for case in cases)


# --- building and running -----------------------------------------------------------------------


_DOCS: dict[str, tuple[str, dict[str, Any], str, Any]] = {}


def _base(stack: str) -> tuple[str, dict[str, Any], str, Any]:
    """(stack text, stack document, inventory relative path, inventory document) of a committed stack, parsed once."""
    if stack not in _DOCS:
        text = (STACKS / f"Pulumi.{stack}.yaml").read_text(encoding="utf-8")
        doc = yaml.safe_load(text)
        relative = doc["config"][NS + "inventory"]
        inventory = yaml.load((STACKS / relative).read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        _DOCS[stack] = (text, doc, relative, inventory)
    return _DOCS[stack]


def _dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False, allow_unicode=True)


def build(case: Case, root: Path) -> Path:
    """A stacks directory under ``root`` holding the case's stack and inventory."""
    text, doc, relative, inventory = _base(case.stack)
    stacks = root / "stacks"
    (stacks / "inventories").mkdir(parents=True)
    stack_file = stacks / f"Pulumi.{case.stack}.yaml"
    inventory_file = stacks / relative
    if case.config:
        doc = copy.deepcopy(doc)
        case.config(doc["config"])
        stack_file.write_text(_dump(doc), encoding="utf-8")
    else:
        stack_file.write_text(text, encoding="utf-8")
    if case.inventory:
        inventory = copy.deepcopy(inventory)
        case.inventory(inventory)
        inventory_file.write_text(_dump(inventory), encoding="utf-8")
    else:
        inventory_file.write_text((STACKS / relative).read_text(encoding="utf-8"), encoding="utf-8")
    if case.files:
        case.files(stack_file, inventory_file)
    return stacks


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``ascend-deploy ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def applied(case: Case, stacks: Path) -> Iterator[None]:
    """The case's patch (an unreadable file), if any."""
    with case.patch(stacks) if case.patch else contextlib.nullcontext():
        yield


if __name__ == "__main__":
    counts = sizes(all_cases())
    for cls, n in sorted(counts.items()):
        print(f"{cls:10} {n}")
    print(f"{'total':10} {sum(counts.values())}")
