"""The smoke check against a fake PD proxy: passes, and fails naming the item."""

from __future__ import annotations

import json

import pytest

from ascend_runtime.checks.smoke import CheckItem, Instance, run_smoke
from ascend_runtime.cli import main

REQUEST_ITEMS = 4
KV_ITEM = "KV handed over prefill -> decode (decode's connector counters)"


async def test_smoke_passes_against_a_pd_proxy(fake) -> None:
    report = await run_smoke(fake.url, timeout_s=5)
    assert report.passed, [i.line() for i in report.failures]
    names = [i.name for i in report.items]
    assert names[:2] == ["proxy GET /health", "proxy GET /v1/models"]
    assert sum("via proxy" in n for n in names) == REQUEST_ITEMS
    assert any("(stream)" in n and "chat" in n for n in names)
    assert all("prefill=prefill-0 decode=decode-0" in i.detail for i in report.items[2:])


async def test_missing_pd_headers_fail_every_request_item(fake) -> None:
    fake.b.pd_headers = False
    report = await run_smoke(fake.url, timeout_s=5)
    assert not report.passed
    failed = report.failures
    assert len(failed) == REQUEST_ITEMS
    assert all("missing PD header x-prefill-instance" in i.detail for i in failed)
    assert (await run_smoke(fake.url, timeout_s=5, require_pd=False)).passed


async def test_health_503_fails_naming_the_item(fake) -> None:
    fake.b.health_status = 503
    report = await run_smoke(fake.url, timeout_s=5)
    assert [i.name for i in report.failures] == ["proxy GET /health"]
    assert "HTTP 503" in report.failures[0].detail


async def test_stream_error_event_fails_the_stream_items(fake) -> None:
    fake.b.error_after = 1
    report = await run_smoke(fake.url, timeout_s=5)
    assert {i.name.split(" POST")[0] for i in report.failures} == {"completion (stream) via proxy", "chat (stream) via proxy"}
    assert all("error event" in i.detail for i in report.failures)


async def test_instances_are_checked_and_a_dead_one_is_named(fake, unused_tcp_port) -> None:
    dead = f"http://127.0.0.1:{unused_tcp_port}"
    insts = [Instance("prefill-0", fake.url, "prefill"), Instance("decode-0", dead, "decode")]
    report = await run_smoke(fake.url, insts, timeout_s=5)
    failed = [i.name for i in report.failures]
    assert failed == ["instance decode-0 (decode) GET /health", "instance decode-0 (decode) GET /v1/models",
                      KV_ITEM]
    assert "unreachable" in report.failures[0].detail


async def test_pd_header_must_name_an_instance_of_the_right_role(fake) -> None:
    insts = [Instance("decode-0", fake.url, "prefill"), Instance("prefill-0", fake.url, "decode")]
    report = await run_smoke(fake.url, insts, timeout_s=5)
    assert len(report.failures) == REQUEST_ITEMS + 1
    assert "x-prefill-instance: prefill-0 is not a prefill instance" in report.failures[0].detail
    assert report.failures[-1].name == KV_ITEM and "not a decode instance" in report.failures[-1].detail


async def test_extra_items_plug_in_and_exceptions_become_failures(fake) -> None:
    async def boom(ctx):
        raise RuntimeError("rank table mismatch")

    report = await run_smoke(fake.url, timeout_s=5, extra_items=[CheckItem("rank tables", boom)])
    assert [(i.name, i.detail) for i in report.failures] == [("rank tables", "RuntimeError: rank table mismatch")]


def _plan_at(url: str):
    """The local stack's real Plan with every instance's API pointed at the fake."""
    import dataclasses
    from urllib.parse import urlsplit

    from ascend_runtime.planner import load_plan

    parts = urlsplit(url)
    plan = load_plan("local")
    insts = tuple(dataclasses.replace(i, api_host=parts.hostname, api_port=parts.port) for i in plan.instances)
    return dataclasses.replace(plan, instances=insts)


async def test_stack_checks_instances_rank_tables_and_launch_files(fake, monkeypatch, tmp_path) -> None:
    from ascend_runtime.checks import smoke as smoke_module
    from ascend_runtime.render.artifacts import render_artifacts, write_artifacts

    plan = _plan_at(fake.url)
    monkeypatch.setattr(smoke_module, "_load_plan", lambda stack, stacks_dir: plan)
    report = await run_smoke(fake.url, stack="local", timeout_s=5)
    assert report.passed, [i.line() for i in report.failures]
    names = [i.name for i in report.items]
    assert "instance decode-1 (decode) GET /health" in names
    assert "rank tables consistent with the Plan" in names and "launch files consistent with the Plan" in names

    rendered = tmp_path / "rendered"
    write_artifacts(render_artifacts(plan), rendered)
    report = await run_smoke(fake.url, stack="local", rendered_dir=rendered, timeout_s=5)
    assert report.passed, [i.line() for i in report.failures]
    table = rendered / "ranktables" / "hccl-decode-1.json"
    table.write_text(table.read_text().replace('"rank_id": "3"', '"rank_id": "33"'))
    (rendered / "launch" / "prefill-0-rank1.sh").unlink()
    report = await run_smoke(fake.url, stack="local", rendered_dir=rendered, timeout_s=5)
    failed = {i.name: i.detail for i in report.failures}
    assert set(failed) == {f"rank tables consistent with the Plan in {rendered}", f"launch files consistent with the Plan in {rendered}"}
    tables_detail = failed[f"rank tables consistent with the Plan in {rendered}"]
    scripts_detail = failed[f"launch files consistent with the Plan in {rendered}"]
    assert "differing ['ranktables/hccl-decode-1.json']" in tables_detail and "launch" not in tables_detail
    assert "missing ['launch/prefill-0-rank1.sh']" in scripts_detail


async def test_an_unloadable_plan_is_a_failed_item(fake) -> None:
    report = await run_smoke(fake.url, stack="nope", timeout_s=5)
    assert [i.name for i in report.failures] == ["plan nope"]
    assert "no stack named 'nope'" in report.failures[0].detail


def test_cli_smoke_exit_codes_and_lines(threaded_fake, capsys, tmp_path) -> None:
    out = tmp_path / "smoke.json"
    assert main(["check", "smoke", "--endpoint", threaded_fake.url, "--timeout-s", "5", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("PASS  ") == 6 and "smoke PASSED" in text
    assert json.loads(out.read_text())["passed"] is True

    threaded_fake.b.health_status = 503
    assert main(["check", "smoke", "--endpoint", threaded_fake.url, "--timeout-s", "5"]) == 1
    text = capsys.readouterr().out
    assert "FAIL  proxy GET /health" in text and "1 of 6 items failed: proxy GET /health" in text


def test_cli_smoke_json_to_stdout_is_the_json_alone(threaded_fake, capsys) -> None:
    assert main(["check", "smoke", "--endpoint", threaded_fake.url, "--timeout-s", "5", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["passed"] is True  # stdout parses as one JSON document
    assert captured.err.count("PASS  ") == 6 and "smoke PASSED" in captured.err  # the text report on stderr


@pytest.mark.parametrize("argv", [["--endpoint", "ftp://x"], ["--endpoint", "http://127.0.0.1:1", "--timeout-s", "0"]])
def test_cli_smoke_bad_input_is_exit_2_naming_the_option(argv, capsys) -> None:
    assert main(["check", "smoke", *argv]) == 2
    assert "--" in capsys.readouterr().err


async def test_kv_handover_passes_when_decode_loaded_the_prompt(fake) -> None:
    insts = [Instance("prefill-0", fake.url, "prefill"), Instance("decode-0", fake.url, "decode")]
    report = await run_smoke(fake.url, insts, timeout_s=5)
    assert report.passed, [i.line() for i in report.failures]
    kv = next(i for i in report.items if i.name == KV_ITEM)
    assert "prefill-0 -> decode-0" in kv.detail and "computed by decode" in kv.detail, kv.detail


@pytest.mark.parametrize("share, words", [(0.0, "no KV moved"), (0.5, "a whole block or more")])
async def test_kv_handover_fails_naming_the_pair_and_numbers(fake, share, words) -> None:
    fake.b.kv_loaded_share = share
    insts = [Instance("prefill-0", fake.url, "prefill"), Instance("decode-0", fake.url, "decode")]
    report = await run_smoke(fake.url, insts, timeout_s=5)
    assert [i.name for i in report.failures] == [KV_ITEM]
    detail = report.failures[0].detail
    assert "prefill-0 -> decode-0" in detail and words in detail and "prompt tokens" in detail, detail


async def test_kv_handover_fails_when_decode_exports_no_counters(fake) -> None:
    fake.b.kv_loaded_share = None
    insts = [Instance("prefill-0", fake.url, "prefill"), Instance("decode-0", fake.url, "decode")]
    report = await run_smoke(fake.url, insts, timeout_s=5)
    assert [i.name for i in report.failures] == [KV_ITEM]
    assert "GET /metrics returned HTTP 404" in report.failures[0].detail


def test_the_counters_read_are_metrics_of_the_supported_release() -> None:
    from ascend_runtime.checks.kv_handover import METRICS_READ
    from ascend_runtime.engine.surface import load_surface

    exposed = load_surface("0.23.0").exposed_metric_names()
    assert all(name in exposed for name in METRICS_READ), [n for n in METRICS_READ if n not in exposed]


def test_cli_smoke_instances_add_the_kv_handover_item(threaded_fake, capsys) -> None:
    url = threaded_fake.url
    argv = ["check", "smoke", "--endpoint", url, "--timeout-s", "5",
            "--instance", f"prefill-0:prefill={url}", "--instance", f"decode-0:decode={url}"]
    assert main(argv) == 0
    assert f"PASS  {KV_ITEM}" in capsys.readouterr().out
    threaded_fake.b.kv_loaded_share = 0.0
    assert main(argv) == 1
    assert f"FAIL  {KV_ITEM}" in capsys.readouterr().out


@pytest.mark.parametrize("value, why", [("decode-0=http://x:1", "NAME:ROLE=URL"), ("d:router=http://x:1", "role"),
                                        ("d:decode=ftp://x", "http(s)")])
def test_cli_smoke_bad_instance_is_exit_2_naming_the_flag(value, why, capsys) -> None:
    assert main(["check", "smoke", "--endpoint", "http://127.0.0.1:1", "--instance", value]) == 2
    err = capsys.readouterr().err
    assert "--instance" in err and why in err


def test_the_checks_job_names_every_instance_of_the_plan() -> None:
    from ascend_runtime.planner import load_plan
    from ascend_runtime.render.objects.common import Context
    from ascend_runtime.render.objects.checks import check_script

    plan = load_plan("a2-staging")
    script = check_script(Context(plan))
    for inst in plan.instances:
        assert f"--instance {inst.name}:{inst.role}={inst.api_url}" in script, script
