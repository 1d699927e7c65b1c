"""The boundary rules one by one, on the models and helpers themselves (the corpus drives them through the CLI)."""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest
import yaml

from ascend_runtime.config import secrets
from ascend_runtime.config.errors import (
    VALUE_LIMIT,
    ConfigError,
    Problem,
    path_problem,
    shorten,
)
from ascend_runtime.config.inventory import Inventory
from ascend_runtime.config.loader import (
    misspelt_namespace,
    parse_inventory,
    parse_stack_config,
    parse_yaml,
)
from ascend_runtime.planner.validation import RESERVED_PORTS

NS = "ascend-deepseek:"
BASE = {NS + "hardware": "atlas-800i-a2", NS + "inventory": "inventories/x.yaml",
        NS + "prefill": {}, NS + "decode": {},
        # the kubernetes target (the default) pulls the kit's image from a registry (config/runtime_image.py)
        NS + "kubernetes": {"runtime_image": "swr.cn-north-4.myhuaweicloud.com/ascend-deepseek/ascend-deploy-runtime:0.1.0"}}


def _node(i: int, devices: list[dict]) -> dict:
    return {"name": f"n{i}", "host_ip": f"192.0.2.{10 + i}", "devices": devices}


def _dev(d: int, ip: str, mask: str | None = "255.255.255.0", gateway: str | None = None) -> dict:
    return {k: v for k, v in {"device_id": d, "device_ip": ip, "netmask": mask, "gateway": gateway}.items() if v is not None}


def test_values_are_cut_and_problems_keep_them_short() -> None:
    text = "x" * 500
    assert len(shorten(text)) == VALUE_LIMIT and shorten(text).endswith("...")
    assert shorten("short") == "short" and shorten(7) == 7
    assert len(str(Problem("a.b", "bad", text))) < 100


def test_namespace_misspellings() -> None:
    for typo in ("ascend-deepsek", "Ascend-DeepSeek", "ascend_deepseek", "ascend-deepseeek", "ascnd-depseek"):
        assert misspelt_namespace(typo), typo
    for other in ("ascend-deepseek", "kubernetes", "pulumi", "aws", "ascend", "deepseek"):
        assert not misspelt_namespace(other), other


def test_other_namespaces_are_left_alone() -> None:
    config, _ = parse_stack_config({**BASE, "kubernetes:context": "c", "pulumi:tags": {"a": "b"}})
    assert config.hardware == "atlas-800i-a2"
    with pytest.raises(ConfigError) as err:
        parse_stack_config({**BASE, "ascend-deepsek:throughput_check": {"min_goodput": 1.0}})
    assert [p.path for p in err.value.problems] == ["ascend-deepsek:throughput_check"]


def test_strict_types() -> None:
    for key, value in [("tp", True), ("tp", "8"), ("dp", 2.0), ("mtp", "true"), ("mtp", 1)]:
        with pytest.raises(ConfigError) as err:
            parse_stack_config({**BASE, NS + "decode": {key: value}})
        assert [p.path for p in err.value.problems] == [f"decode.{key}"], (key, value)


def test_env_names_have_their_own_validator(monkeypatch: pytest.MonkeyPatch) -> None:
    """The name rule holds whatever the value validator (config/secrets.py) checks."""
    monkeypatch.setattr(secrets, "check_extra_env", lambda raw: raw)
    with pytest.raises(ConfigError) as err:
        parse_stack_config({**BASE, NS + "engine": {"extra_env": {"GOOD": "1", "1BAD": "x", "A-B": "y"}}})
    assert sorted(p.path for p in err.value.problems) == ["engine.extra_env.1BAD", "engine.extra_env.A-B"]
    config, _ = parse_stack_config({**BASE, NS + "engine": {"extra_env": {"GOOD_1": "1", "_X": "2"}}})
    assert set(config.engine.extra_env) == {"GOOD_1", "_X"}


@pytest.mark.parametrize("path, ok", [
    ("/data/models", True), ("/data/models/DeepSeek-R1-W8A8", True), ("/", False), ("data", False),
    ("/data/../etc", False), ("/data//x", False), ("/data/x/", False), ("/data/./x", False), ("/da ta", False),
    ("//data", False), ("/data/x;rm", False),
])
def test_mount_paths(path: str, ok: bool) -> None:
    assert (path_problem(path) is None) == ok


def test_loopback_by_target() -> None:
    inventory = Inventory.model_validate({"nodes": [_node(0, []), {"name": "l", "host_ip": "127.0.1.1"}]})
    assert [p.path for p in inventory.target_problems("kubernetes")] == ["inventory.nodes[1].host_ip"]
    assert [p.path for p in inventory.target_problems("kind")] == ["inventory.nodes[1].host_ip"]
    assert [p.path for p in inventory.target_problems("local")] == ["inventory.nodes[0].host_ip"]


def test_on_link_plane_shares_one_subnet() -> None:
    same = [_node(0, [_dev(0, "10.0.0.1"), _dev(1, "10.0.1.1")]), _node(1, [_dev(0, "10.0.0.2"), _dev(1, "10.0.1.2")])]
    assert parse_inventory({"nodes": same}).nodes  # one subnet per plane: plane 0 and plane 1 may differ
    split = [_node(0, [_dev(0, "10.0.0.1")]), _node(1, [_dev(0, "10.0.9.2")])]
    with pytest.raises(ConfigError) as err:
        parse_inventory({"nodes": split})
    assert [p.path for p in err.value.problems] == ["inventory.nodes[1].devices[0].device_ip"]
    assert "plane 0" in str(err.value)


def test_routed_plane_may_span_subnets_with_one_gateway_per_subnet() -> None:
    routed = [_node(0, [_dev(0, "10.0.0.1", gateway="10.0.0.254")]), _node(1, [_dev(0, "10.0.9.2", gateway="10.0.9.254")])]
    assert parse_inventory({"nodes": routed}).nodes
    other_gw = [*routed, _node(2, [_dev(0, "10.0.9.3", gateway="10.0.9.253")])]
    with pytest.raises(ConfigError) as err:
        parse_inventory({"nodes": other_gw})
    assert [p.path for p in err.value.problems] == ["inventory.nodes[2].devices[0].gateway"]


def test_device_subnet_rules() -> None:
    for dev, at in [
        (_dev(0, "10.0.0.0"), "device_ip"), (_dev(0, "10.0.0.255"), "device_ip"),
        (_dev(0, "10.0.0.1", gateway="10.0.1.1"), "gateway"), (_dev(0, "10.0.0.1", gateway="10.0.0.1"), "gateway"),
        (_dev(0, "10.0.0.1", mask=None, gateway="10.0.0.254"), "netmask"), (_dev(0, "10.0.0.1", mask="255.0.255.0"), "netmask"),
    ]:
        with pytest.raises(ConfigError) as err:
            parse_inventory({"nodes": [_node(0, [dev])]})
        assert [p.path for p in err.value.problems] == [f"inventory.nodes[0].devices[0].{at}"], dev
    assert parse_inventory({"nodes": [_node(0, [_dev(0, "10.0.0.0", mask="255.255.255.254")])]})  # /31: both usable


@pytest.mark.parametrize("ip", ["0.0.0.0", "255.255.255.255", "224.0.0.1", "169.254.1.1", "240.0.0.1", "0.0.0.7"])
def test_unusable_addresses(ip: str) -> None:
    with pytest.raises(ConfigError):
        parse_inventory({"nodes": [{"name": "n", "host_ip": ip}]})
    with pytest.raises(ConfigError):
        parse_inventory({"nodes": [_node(0, [_dev(0, ip, mask=None)])]})


def test_reserved_ports_cover_the_cluster_ports() -> None:
    covered = {p for low, high, _ in RESERVED_PORTS for p in range(low, high + 1)}
    assert {2379, 2380, 6443, 10248, 10249, 10250, 10255, 10256, 10257, 10259, 30000, 32767} <= covered
    assert not covered & {8000, 9000, 9100, 13355, 28000, 36000}


def test_duplicate_keys_and_yaml_errors_name_the_line() -> None:
    with pytest.raises(ConfigError) as err:
        parse_yaml("a: 1\nb:\n  c: 1\n  c: 2\n", "inventory")
    assert [p.path for p in err.value.problems] == ["b.c"] and "lines 3 and 4" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_yaml("a: [1\n", "inventory")
    assert "line 2" in str(err.value)
    # an alias is walked once: a self-referencing or exploding document does not hang the check
    bomb = "a: &a [1, 2]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nd: [*c, *c, *c, *c]\n"
    assert set(parse_yaml(bomb, "inventory")) == {"a", "b", "c", "d"}


def test_committed_inventories_keep_the_rules() -> None:
    from tests.config.corpus import STACKS

    for path in sorted((STACKS / "inventories").glob("*.yaml")):
        inventory = parse_inventory(yaml.safe_load(path.read_text()), str(path))
        assert all(isinstance(n.host_ip, IPv4Address) for n in inventory.nodes)
