"""Shell artifacts stay inert whatever the data: the quoting filter, the strict template environment,
and rendered scripts run under bash with every string field carrying shell metacharacters.

The Plans here are patched after planning, so values that config validation would refuse still
reach the renderers: the render layer must be safe on its own.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jinja2
import pytest

from ascend_runtime.planner import Plan, load_plan
from ascend_runtime.render.engine_args import engine_command
from ascend_runtime.render.environment import rank_env
from ascend_runtime.render.launch import (
    hccn_conf,
    launch_script,
    leader_watch_script,
    render_template_in,
)
from ascend_runtime.render.objects.checks import check_script
from ascend_runtime.render.objects.common import Context
from ascend_runtime.render.objects.engine import probes
from ascend_runtime.render.paths import LEADER_WATCH, templates_dir
from ascend_runtime.render.shell import quote, shell_environment, text_environment

CANARY = "CANARY"
NASTY = [
    "plain", "two words", "", "it's", 'say "hi"', "back\\slash", "$HOME", "$(touch CANARY-a)", "`touch CANARY-b`",
    "a;touch CANARY-c", "line\ntouch CANARY-d", "cr\rtouch CANARY-e", "tab\there", "nul-less \x1b[31m", "\u2028sep",
    "'$(touch CANARY-f)'", "\"$(touch CANARY-g)\"", "\\'; touch CANARY-h; '", "-n", "é ü 中文", "!event",
]


def payload(tag: str) -> str:
    """A value carrying every shell metacharacter; each vector would create its own canary file."""
    return (f"{tag}$(touch {CANARY}-{tag}-1)`touch {CANARY}-{tag}-2`;touch {CANARY}-{tag}-3;'\"\n"
            f"touch {CANARY}-{tag}-4 \\ \"$(touch {CANARY}-{tag}-5)\" '$(touch {CANARY}-{tag}-6)' $HOME")


def balanced_payload(tag: str) -> str:
    """Substitutions and a line break that leave any surrounding quoting balanced, so an unsafe
    script would run them rather than fail to parse."""
    return f"{tag}$(touch {CANARY}-{tag}-1)\ntouch {CANARY}-{tag}-2 #"


def canaries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(f"*{CANARY}*"))


# --- the filter and the strict environment -------------------------------------------------------


@pytest.mark.parametrize("value", NASTY)
def test_quote_is_one_inert_word_on_one_line(value: str, tmp_path: Path) -> None:
    word = quote(value)
    assert "\n" not in word and "\r" not in word
    script = f"# comment {word}\nprintf '%s' {word}\n# {word}\n"
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == value.encode()
    assert canaries(tmp_path) == []


def test_quote_keeps_plain_values_as_they_were() -> None:
    for value in ("a2-node-01", "192.0.2.11", "0,1,2,3", "expandable_segments:True", "/data/models/x", "--seed"):
        assert quote(value) == value


@pytest.mark.parametrize("source", [
    "echo {{ name }}",                       # no filter
    "echo {{ name | upper }}",               # another filter last
    "echo {{ name | sh | upper }}",          # sh, but not last
    "echo {{ name | sh if on else name }}",  # one branch unquoted
    "{% for n in names %}x {{ n }}{% endfor %}",
    "{% set v = name %}echo {{ v }}",
    'echo "hello {{ name | sh }}"',          # a quoted word inside a double-quoted string expands again
    "echo 'hello {{ name | sh }}'",
    "# {{ name | sh }} ok\necho \"{{ name | sh }}\"",
])
def test_unquoted_interpolation_fails_when_the_template_is_rendered(source: str, tmp_path: Path) -> None:
    (tmp_path / "planted.sh.j2").write_text(source + "\n")
    with pytest.raises(jinja2.TemplateAssertionError, match=r"\| sh"):
        render_template_in(tmp_path, "planted.sh.j2", name="$(touch CANARY)", names=["a"], on=True)


def test_quoted_interpolations_render(tmp_path: Path) -> None:
    (tmp_path / "fine.sh.j2").write_text(
        "# {{ name | sh }}: comment\n"
        "readonly NAME={{ name | sh }}\n"
        "v=${OVERRIDE:-{{ name | sh }}}\n"
        "args=({% for n in names %}{% if not loop.first %} {% endif %}{{ n | sh }}{% endfor %})\n"
        "printf '%s|' \"$NAME\" \"$v\" \"${args[@]}\" {{ (name if on else 'x') | sh }}\n"
    )
    text = render_template_in(tmp_path, "fine.sh.j2", name=payload("t"), names=[payload("u"), "b"], on=True)
    result = subprocess.run(["bash", "-c", text], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "|".join([payload("t"), payload("t"), payload("u"), "b", payload("t")]) + "|"
    assert canaries(tmp_path) == []
    # the rule is the shell templates': a markdown template may interpolate freely
    (tmp_path / "sheet.md.j2").write_text("stack {{ name }}\n")
    assert render_template_in(tmp_path, "sheet.md.j2", name="x") == "stack x\n"


def test_every_shipped_template_compiles_in_its_environment() -> None:
    loader = jinja2.FileSystemLoader(str(templates_dir()))
    shell, text = shell_environment(loader), text_environment(loader)
    names = sorted(p.name for p in templates_dir().glob("*.j2") if p.name != "grafana-dashboard.json.j2")
    assert "entrypoint.sh.j2" in names and "hccn.conf.j2" in names
    for name in names:
        (shell if name.endswith((".sh.j2", ".conf.j2")) else text).get_template(name)


# --- rendered artifacts under bash -----------------------------------------------------------------


def poisoned(plan: Plan, extra_env: dict[str, str] | None = None, payload=payload) -> Plan:
    """``plan`` with every string field that reaches a script replaced by ``payload(field)``."""
    config = copy.deepcopy(plan.config)
    config["kubernetes"]["namespace"] = payload("namespace")
    config["model"]["name"] = payload("model")
    config["model"]["weights_path"] = "/data/" + payload("weights")
    config["engine"]["extra_args"] = [payload("arg"), "--flag=" + payload("argval")]
    config["engine"]["extra_env"] = extra_env if extra_env is not None else {"EXTRA_VALUE": payload("env")}
    names = {n.name: payload(f"node{i}") for i, n in enumerate(plan.nodes)}
    nodes = tuple(replace(n, name=names[n.name], nic=payload(f"nic{i}"), host_ip=payload(f"ip{i}"))
                  for i, n in enumerate(plan.nodes))
    instances = tuple(
        replace(inst, api_host=payload(f"leader{i}"), ranks=tuple(
            replace(r, node=names[r.node], nic=payload(f"nic-{r.name}"), host_ip=payload(f"ip-{r.name}"),
                    engine_id=payload(f"engine-{r.name}"),
                    devices=tuple(replace(d, device_ip=payload(f"dev-{r.name}-{d.device_id}")) for d in r.devices))
            for r in inst.ranks))
        for i, inst in enumerate(plan.instances)
    )
    return replace(plan, stack=payload("stack"), config=config, nodes=nodes, instances=instances,
                   proxy_host=payload("proxy"))


STUB_VLLM = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$STUB_OUT/argv"
env -0 > "$STUB_OUT/env"
"""


#: stands in for coreutils ``timeout`` (the scripts' TCP probes of the leader): records its words, succeeds
STUB_TIMEOUT = """#!/usr/bin/env bash
printf '%s\\0' "$@" >> "$STUB_OUT/probes"
"""


def _stub_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("vllm", STUB_VLLM), ("timeout", STUB_TIMEOUT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _run_rank(plan: Plan, rank, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / rank.name
    out = run_dir / "out"
    out.mkdir(parents=True)
    script = run_dir / f"{rank.name}.sh"
    script.write_text(launch_script(plan, rank))
    (run_dir / LEADER_WATCH).write_text(leader_watch_script())
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_DEPLOY_")}
    env.update({
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "ASCEND_DEPLOY_CHECK_FILES": "0",
        "ASCEND_DEPLOY_LEADER_POLL_S": "0.1",
        "ASCEND_DEPLOY_LEADER_FAILURES": "1",
        "ASCEND_DEPLOY_STARTUP_TIMEOUT_S": "20",
        "STUB_OUT": str(out),
    })
    result = subprocess.run(["bash", str(script)], cwd=run_dir, env=env, capture_output=True, text=True, timeout=60)
    return result, out


@pytest.mark.parametrize("make", [payload, balanced_payload], ids=["metacharacters", "balanced"])
@pytest.mark.parametrize("stack", ["a2-staging", "kind"])
def test_launch_scripts_with_metacharacters_run_inert(stack: str, make, tmp_path: Path) -> None:
    plan = poisoned(load_plan(stack), payload=make)
    _stub_bin(tmp_path)
    assert any(not r.is_leader for r in plan.ranks)  # headless ranks source leader-watch.sh too
    for rank in plan.ranks:
        result, out = _run_rank(plan, rank, tmp_path)
        assert canaries(tmp_path) == [], (rank.name, result.stderr)
        assert result.returncode == 0, (rank.name, result.stderr)
        # the engine got exactly the Plan's argv and environment, byte for byte
        assert ["vllm", *(out / "argv").read_text().split("\0")[:-1]] == engine_command(plan, rank)
        got = dict(item.split("=", 1) for item in (out / "env").read_text().split("\0") if "=" in item)
        for key, value in rank_env(plan, rank).items():
            assert got.get(key) == value, (rank.name, key)
        assert got["EXTRA_VALUE"] == make("env")
        assert rank.node in result.stderr  # the start line prints the node name verbatim
        if not rank.is_leader:  # the wait for the leader's DP port probed the Plan's host and port, verbatim
            inst = plan.instance(rank.instance)
            words = (out / "probes").read_text().split("\0")
            assert words[4:7] == ["dp-rpc", inst.api_host, str(inst.dp_rpc_port)], words[:8]


def test_metacharacters_in_env_names_stop_the_script_inert(tmp_path: Path) -> None:
    names = {f"BAD$(touch {CANARY}-k1)": "v", f"A;touch {CANARY}-k2;B": "v", f"X\ntouch {CANARY}-k3\nY": "v",
             f"`touch {CANARY}-k4`": "v"}
    plan = poisoned(load_plan("a2-staging"), extra_env=names)
    _stub_bin(tmp_path)
    result, out = _run_rank(plan, plan.ranks[0], tmp_path)
    assert canaries(tmp_path) == [], result.stderr
    assert result.returncode != 0 and "not a valid identifier" in result.stderr
    assert not (out / "argv").exists()  # the engine never starts with a broken environment


def test_leader_watch_passes_the_leader_host_as_data(tmp_path: Path) -> None:
    (tmp_path / LEADER_WATCH).write_text(leader_watch_script())
    for host in (payload("leader"), balanced_payload("leader")):
        script = f"source ./{LEADER_WATCH}\nLEADER_HOST={quote(host)}\nLEADER_PORT=1\nleader_up || echo down\n"
        result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert canaries(tmp_path) == []
        assert result.stdout == "down\n", result.stderr


def test_hccn_conf_with_metacharacters_is_inert(tmp_path: Path) -> None:
    plan = poisoned(load_plan("a2-staging"))
    for node in plan.nodes:
        text = hccn_conf(plan, node.name)
        assert all(line.startswith(("#", "address_", "netmask_", "netdetect_", "gateway_")) for line in text.splitlines())
        result = subprocess.run(["bash", "-c", text], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    assert canaries(tmp_path) == []


def test_simulated_probe_takes_the_url_as_an_argument(tmp_path: Path) -> None:
    plan = load_plan("kind")
    evil = f"x' if open('{CANARY}-py', 'w') else '"  # would run if the URL were part of the code
    plan = replace(plan, config={**plan.config, "kubernetes": {**plan.config["kubernetes"], "namespace": evil}})
    ctx = Context(plan)
    commands = [probe["exec"]["command"] for inst in plan.instances for rank in inst.ranks if not rank.is_leader
                for probe in probes(ctx, inst, rank).values() if "exec" in probe]
    assert commands
    for command in commands:
        try:
            subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, capture_output=True, timeout=20)
        except subprocess.TimeoutExpired:
            pass
        assert canaries(tmp_path) == []
        assert evil not in command[2] and any(evil in arg for arg in command[3:])  # data only as arguments


def test_check_job_script_with_metacharacters_is_inert(tmp_path: Path) -> None:
    plan = poisoned(load_plan("a2-staging"))
    bin_dir = _stub_bin(tmp_path)
    (bin_dir / "ascend-deploy").write_text("#!/usr/bin/env bash\nprintf '%s\\0' \"$@\" >> \"$STUB_OUT/argv\"\n")
    (bin_dir / "ascend-deploy").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_OUT": str(tmp_path)}
    result = subprocess.run(["/bin/sh", "-c", check_script(Context(plan))], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert canaries(tmp_path) == []
    argv = (tmp_path / "argv").read_text().split("\0")
    assert argv.count(plan.proxy_url) == 2  # smoke and throughput got the endpoint as one argument
