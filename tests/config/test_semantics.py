"""Values that pass their types but mean something else: one machine listed twice, Pulumi's markers as data.

Two inventory nodes reached at the same SSH host and port are refused naming both (playbooks would act on one
machine twice). A plaintext stack value spelled like one of Pulumi's markers (``[secret]``, the unknown-value
string, the signature key; ascend_runtime/config/pulumi_sentinels.py cites where the SDK defines each) is
refused by ``plan`` (exit 2, the key named), and the Pulumi program raises before registering anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ascend_runtime.cli import main
from ascend_runtime.config.errors import ConfigError
from ascend_runtime.config.loader import parse_inventory
from tests.stack_copies import edited_stacks

NS = "ascend-deepseek:"
#: Pulumi's markers, spelled here as the SDK spells them (pulumi/automation/_config.py, pulumi/runtime/rpc.py).
SECRET_SENTINEL = "[secret]"
UNKNOWN_SENTINEL = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
SIGNATURE_KEY = "4dabf18193072939515e22adb298388d"


def _inventory(*nodes: dict[str, Any], port: int = 22) -> dict[str, Any]:
    return {"ssh": {"port": port}, "nodes": [{"name": f"n{i}", "host_ip": f"192.0.2.{10 + i}", **n}
                                            for i, n in enumerate(nodes)]}


@pytest.mark.parametrize(("nodes", "path", "endpoint"), [
    (({"ssh_host": "bastion.example.net"}, {}, {"ssh_host": "Bastion.Example.NET"}), "inventory.nodes[2].ssh_host",
     "bastion.example.net:22"),
    (({}, {"ssh_host": "192.0.2.10"}), "inventory.nodes[1].ssh_host", "192.0.2.10:22"),
    (({"ssh_host": "h.example.net", "ssh_port": 2201}, {"ssh_host": "h.example.net", "ssh_port": 2201}),
     "inventory.nodes[1].ssh_host", "h.example.net:2201"),
    (({"ssh_port": 22}, {"host_ip": "192.0.2.10"}), "inventory.nodes[1].host_ip", "192.0.2.10:22"),
], ids=["host-name-case", "ssh-host-is-another-host-ip", "same-host-and-port", "host-ip-twice"])
def test_two_nodes_reached_at_one_ssh_endpoint_are_refused_naming_both(nodes: tuple[dict[str, Any], ...], path: str,
                                                                      endpoint: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_inventory(_inventory(*nodes))
    problem = next(p for p in err.value.problems if p.path == path)
    named = [f"n{i}" for i in range(len(nodes))]
    first = next(n for n in named if f"{n} (nodes[" in problem.message)
    assert endpoint in problem.message and first != named[-1] and f"{named[-1]} (nodes[{len(nodes) - 1}])" in problem.message


def test_nodes_behind_one_host_on_their_own_ports_pass() -> None:
    inventory = parse_inventory(_inventory({"ssh_host": "h.example.net", "ssh_port": 2201},
                                           {"ssh_host": "h.example.net", "ssh_port": 2202}, {}))
    assert len(inventory.nodes) == 3


def _set_env(value: Any) -> Any:
    def edit(config: dict[str, Any]) -> None:
        config[NS + "engine"]["extra_env"] = {"HF_HOME": value}
    return edit


def _set_model_name(value: Any) -> Any:
    def edit(config: dict[str, Any]) -> None:
        config.setdefault(NS + "model", {})["name"] = value
    return edit


@pytest.mark.parametrize(("edit", "path"), [
    (_set_env(SECRET_SENTINEL), "engine.extra_env.HF_HOME"),
    (_set_env(" [Secret] "), "engine.extra_env.HF_HOME"),
    (_set_model_name(UNKNOWN_SENTINEL), "model.name"),
    (_set_env({SIGNATURE_KEY: "1b47061264138c4ac30d75fd1eb44270", "value": "x"}),
     f"engine.extra_env.HF_HOME.{SIGNATURE_KEY}"),
], ids=["secret-placeholder", "secret-placeholder-spaced", "unknown-marker", "signature-key"])
def test_plan_refuses_a_value_spelled_like_a_pulumi_marker(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          edit: Any, path: str) -> None:
    stacks = edited_stacks(tmp_path, "a2-staging", edit)
    assert main(["plan", "--stack", "a2-staging", "--stacks-dir", str(stacks)]) == 2
    err = capsys.readouterr().err
    assert f"  - {path}: is spelled like Pulumi's" in err and "Traceback" not in err, err[:600]


def test_an_inventory_value_spelled_like_a_pulumi_marker_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        parse_inventory(_inventory({"nic": SECRET_SENTINEL}))
    assert any(p.path == "inventory.nodes[0].nic" and "Pulumi" in p.message for p in err.value.problems)


def test_the_pulumi_program_registers_nothing_for_a_secret_placeholder(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.deploy.harness import run_stack

    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(edited_stacks(tmp_path, "kind", _set_env(SECRET_SENTINEL))))
    run = run_stack("kind")
    assert type(run.error).__name__ == "ConfigError" and "engine.extra_env.HF_HOME" in str(run.error)
    assert run.resources == [] and run.exports == {}
