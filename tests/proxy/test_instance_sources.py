"""One rule for every source of instances (flags, instances file, Kubernetes discovery, admin API, Python): no
credentials or non-routable special addresses in URLs, weights within the flags' range; a password never reaches
an answer, a log line or /metrics; the admin API refuses what the flags refuse, and a deep admin body is a 400."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from ascend_runtime.cli import main
import ascend_runtime.proxy.workers as workers
from ascend_runtime.proxy.boundedjson import MAX_DEPTH
from ascend_runtime.proxy.discovery import FileDiscovery, KubernetesDiscovery
from ascend_runtime.proxy.instances import InstanceSpec, InstanceSpecError, load_instances_file

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PASSWORD = "hunter2-pw"
#: URLs no instance may have: (URL, what the refusal says)
REFUSED_URLS = [
    (f"http://admin:{PASSWORD}@10.0.0.9:8100", "credentials"),
    (f"http://{PASSWORD}@10.0.0.9:8100", "credentials"),
    ("http://169.254.169.254:80", "link-local"),
    ("http://169.254.10.1:8100", "link-local"),
    ("http://2852039166:80", "link-local"),  # 169.254.169.254 as the resolver also reads it
    ("http://0251.0376.0251.0376:80", "link-local"),
    ("http://[::ffff:169.254.169.254]:80", "link-local"),
    ("http://[fe80::1]:8100", "link-local"),
    ("http://224.0.0.1:8100", "multicast"),
    ("http://[ff02::1]:8100", "multicast"),
    ("http://0.0.0.0:8100", "unspecified"),
    ("http://[::]:8100", "unspecified"),
]
ALLOWED_URLS = ["http://127.0.0.2:8100", "http://127.1:8100", "http://[::1]:8100", "http://localhost:8100",
                "http://10.0.0.9:8100", "http://decode-0.svc:8100", "https://[2001:db8::1]:8443"]
#: instance weights the flags refuse, as flag text and as admin JSON
REFUSED_WEIGHTS = [("1e300", 1e300), ("1e7", 1e7), ("0", 0), ("-1", -1), ("1e-9", 1e-9), ("nan", "nan"),
                   ("inf", "inf"), ("x", "x")]
BASE = ["proxy", "--decode", "http://127.0.0.1:19002", "--port", "18990"]


class Started(Exception):
    """The command got as far as starting the proxy."""


def _run_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    def started(*args: object, **_k: object) -> None:
        for arg in args:  # the coroutine the command would have run
            if asyncio.iscoroutine(arg):
                arg.close()
        raise Started()

    monkeypatch.setattr(workers, "run_loop", started)
    monkeypatch.setattr(workers, "serve_workers", started)
    try:
        code: object = main(argv)
    except Started:
        code = "started"
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("url", "why"), REFUSED_URLS)
def test_every_source_refuses_the_url(url: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    # the --prefill flag: exit 2, nothing started, no password in what is printed
    code, err = _run_cli(BASE + ["--prefill", url], monkeypatch, capsys)
    assert code == 2 and why in err and PASSWORD not in err and "Traceback" not in err, (code, err)
    # the instances file, YAML and JSON
    for name, text in (("i.yaml", f"prefill: ['{url}']\n"), ("i.json", json.dumps([{"role": "decode", "url": url}]))):
        (tmp_path / name).write_text(text)
        with pytest.raises(InstanceSpecError, match=why) as exc:
            load_instances_file(tmp_path / name)
        assert PASSWORD not in str(exc.value)
    # a spec built in Python (the Plan's endpoints, ProxyConfig)
    with pytest.raises(InstanceSpecError, match=why) as exc:
        InstanceSpec("p0", "prefill", url)
    assert PASSWORD not in str(exc.value)


def test_loopback_and_names_stay_allowed() -> None:
    for url in ALLOWED_URLS:
        assert InstanceSpec("i", "decode", url).url == url


def test_kubernetes_discovery_leaves_out_a_special_address(caplog: pytest.LogCaptureFixture) -> None:
    k = KubernetesDiscovery(lambda s: None, "ns", {"decode": "app=d"})
    obj = {"metadata": {"name": "d-slice"}, "ports": [{"name": "http", "port": 8100}],
           "endpoints": [{"addresses": [address], "targetRef": {"name": name}} for name, address in
                         (("decode-0", "10.1.1.1"), ("decode-1", "169.254.169.254"), ("decode-2", "fe80::1"),
                          ("decode-3", "0.0.0.0"))]}
    with caplog.at_level(logging.WARNING, logger="ascend_runtime.proxy.discovery"):
        assert k.handle_event("decode", {"type": "ADDED", "object": obj})
    assert [s.name for s in k.specs()] == ["decode-0"]
    assert sum("left out" in r.getMessage() for r in caplog.records) == 3


async def test_a_reloaded_instances_file_with_a_metadata_url_keeps_the_last_list(tmp_path: Path) -> None:
    path = tmp_path / "instances.yaml"
    path.write_text("decode: ['http://127.0.0.1:19002']\n")
    applied: list[list[InstanceSpec]] = []
    fd = FileDiscovery(path, applied.append)
    assert fd.reload() and [s.url for s in applied[-1]] == ["http://127.0.0.1:19002"]
    path.write_text(f"decode: ['http://127.0.0.1:19002', 'http://u:{PASSWORD}@169.254.169.254:80']\n")
    assert not fd.reload() and len(applied) == 1
    assert fd.last_error is not None and PASSWORD not in fd.last_error


async def _admin_add(http, px, body) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    async with http.post(px.url + "/admin/instances/add", headers=AUTH, json=body) as resp:
        return resp.status, await resp.json()


async def test_the_admin_api_refuses_what_the_flags_refuse(stubs, proxy, http, caplog, monkeypatch,
                                                             capsys) -> None:  # type: ignore[no-untyped-def]
    """One table, both doors: every URL and weight the --prefill flag refuses, POST /admin/instances/add
    refuses with 400 naming the same problem, changes nothing, and prints the password nowhere."""
    p, d = await stubs("prefill", "p0"), await stubs("decode", "d0")
    px = await proxy(p, d, admin_token=TOKEN)
    caplog.set_level(logging.DEBUG)
    cases = [({"url": url}, f"{url},name=x", why) for url, why in REFUSED_URLS]
    cases += [({"url": "http://127.0.0.1:19003", "weight": value}, f"http://127.0.0.1:19003,name=x,weight={text}",
               "weight") for text, value in REFUSED_WEIGHTS]
    for fields, flag, why in cases:
        code, err = _run_cli(BASE + ["--prefill", flag], monkeypatch, capsys)
        assert code == 2 and why in err, (flag, code, err)
        status, body = await _admin_add(http, px, {"name": "x", "role": "prefill", **fields})
        assert status == 400 and why in body["error"]["message"], (fields, status, body)
        assert PASSWORD not in body["error"]["message"]
    status, body = await _admin_add(http, px, {"name": "x", "role": "prefill", "url": "http://127.0.0.1:19003",
                                               "weight": True})  # JSON only: a boolean is no weight
    assert status == 400 and "weight" in body["error"]["message"], body
    assert px.pool.get("x") is None and sorted(s.name for s in px.pool.all()) == ["d0", "p0"]
    async with http.get(px.url + "/metrics") as resp:
        assert PASSWORD not in await resp.text()
    assert not [r for r in caplog.records if PASSWORD in r.getMessage()]
    # what both accept, both accept: loopback, a weight at either end of the range
    for weight in (1e-6, 1e6):
        status, body = await _admin_add(http, px, {"name": f"p-{weight:g}", "role": "prefill",
                                                   "url": "http://127.0.0.2:19004", "weight": weight})
        assert status == 200, body


@pytest.mark.parametrize("route", ["add", "remove", "drain"])
async def test_a_deeply_nested_admin_body_is_a_400(stubs, proxy, http, route: str) -> None:
    p, d = await stubs("prefill", "p0"), await stubs("decode", "d0")
    px = await proxy(p, d, admin_token=TOKEN)
    for depth in (MAX_DEPTH + 1, 5000):  # past the proxy's bound, and past Python's recursion limit
        raw = b'{"name": ' + b"[" * depth + b"]" * depth + b"}"
        async with http.post(px.url + f"/admin/instances/{route}", headers=AUTH, data=raw) as resp:
            assert resp.status == 400, await resp.text()
            assert "nested deeper than" in (await resp.json())["error"]["message"]
    assert sorted(s.name for s in px.pool.all()) == ["d0", "p0"]
