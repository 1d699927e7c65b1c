"""Parsers and version ordering against the formats of facts section 9 (no SSH)."""

from ascend_runtime.hosts import parsers as p
from ascend_runtime.hosts.quoting import render
from ascend_runtime.hosts.versions import Version, check_range

A2_INFO = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 25.2.0                   Version: 25.2.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 97.9        34                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3408 / 65536         |
+===========================+===============+====================================================+
| 2     910B3               | Alarm         | 92.3        32                0    / 0             |
| 0                         | 0000:81:00.0  | 0           0    / 0          41052/ 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
| 2       0                 | 1333928       |                          | 37709                   |
+===========================+===============+====================================================+
[WARNING]The driver package may not be completely installed, ...
"""


def test_npu_smi_info_a2_sample() -> None:
    out = p.npu_smi_info(A2_INFO)
    assert out["chip_count"] == 2 and out["version"] == "25.2.0"
    assert [c["npu_id"] for c in out["chips"]] == [0, 2]
    assert out["unhealthy"] == ["2/0=Alarm"] and out["all_healthy"] is False


def test_hccn_variants() -> None:
    assert p.hccn_ip("ipaddr:10.10.0.10\nnetmask:255.255.255.0\n") == {
        "ipaddr": "10.10.0.10", "netmask": "255.255.255.0", "link": None}
    assert p.hccn_ip("Get ipconf failed, because no ip was preset there!")["ipaddr"] is None
    vnic = "vnic link status: UP\nvnic ipaddr: 192.168.2.199\nvnic netmask: 255.255.255.0"
    assert p.PARSERS["hccn_vnic"](vnic) == {"ipaddr": "192.168.2.199", "netmask": "255.255.255.0", "link": "UP"}
    # the RoCE port IP (-ip -g) and the A3 VNIC IP (-vnic -g) are never read from each other's output
    assert p.hccn_ip(vnic) == {"ipaddr": None, "netmask": None, "link": None}
    assert p.PARSERS["hccn_vnic"]("ipaddr:10.10.0.10\nnetmask:255.255.255.0\n")["ipaddr"] is None
    assert p.hccn_netdetect("netdetect address: 11.12.165.1")["address"] == "11.12.165.1"
    assert p.hccn_netdetect("netdetect addr: 11.12.165.1")["address"] == "11.12.165.1"
    assert p.hccn_gateway("default gateway:11.12.165.1, Iface:eth0") == {"address": "11.12.165.1", "iface": "eth0"}
    # an unset address the tool prints as zeros is unset: setting one is not a replacement, `present` fails
    assert p.hccn_gateway("default gateway:0.0.0.0, Iface:eth0") == {"address": None, "iface": "eth0"}
    assert p.hccn_netdetect("netdetect address: 0.0.0.0")["address"] is None
    assert p.hccn_tls("dev_id:0, tls switch[1](0:disable, 1:enable), tls alarm time threshold[60]days")["switch"] == "1"
    assert p.hccn_net_health("net health status: Receive timeout")["status"] == "Receive timeout"
    assert p.hccn_ping("recv time out seq=0\n3 packets transmitted, 2 received, 33.33% packet loss")["ok"] is False
    kv = p.npu_smi_kv("\tSDID                           : 16777216\n\tSuper Pod ID                   : 0\n")
    assert kv["sdid"] == "16777216" and kv["super_pod_id"] == "0"
    assert p.key_value_file("Version=24.1.rc1\ncompatible_version_fw=[7.0.0,7.2.99]")["version"] == "24.1.rc1"


def test_versions_and_quoting() -> None:
    assert Version("24.1.rc1") < Version("24.1.rc3") < Version("24.1.0") < Version("24.1.1")
    assert check_range("23.0.rc3", "24.1.rc1") == "23.0.rc3 is below the supported minimum 24.1.rc1"
    assert check_range("8.1.RC1", "8.0.0") is None
    assert render("ip link show dev {nic}", {"nic": "eth0;rm -rf /"}) == "ip link show dev 'eth0;rm -rf /'"


def test_a_sudo_refusal_is_reported_in_sudos_words_not_a_profiles() -> None:
    from ascend_runtime.hosts.engine import sudo_reason

    noisy = "rm: cannot remove '/root/.pyenv/shims/tmp.x': No such file or directory\nsudo: a password is required\n"
    assert sudo_reason(noisy) == "sudo: a password is required"
    assert sudo_reason("some other failure\n\n") == "some other failure"
    assert sudo_reason("") == ""
