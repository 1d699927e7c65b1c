"""Secret values reach only the kit's own Secret objects: never the Plan, render output, other objects,
the stack outputs, the CLI's output or logs. Plaintext secrets in a stack are refused (exit 2).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ascend_runtime.cli import main
from ascend_runtime.render.objects.common import (
    ENGINE_ENV_SECRET_NAME,
    secret_placeholder,
)

from .harness import PROJECT, ROOT, SECRET_SIG, Run, normalize, run_stack
from .pods import pod_spec, workload_objects

STACK = "a2-staging"
#: Values of the Pulumi secrets (mock config): they may appear in the kit's Secrets' data and nowhere else.
SECRET_VALUES = {
    "hf_token": "hf-MARKER-7d1c0e5a-value",
    "image_pull_credentials": '{"auths":{"registry":{"auth":"MARKER-3b9f-pull"}}}',
    "model_source_credentials": "MARKER-model-source-5e2a",
}
#: Ciphertexts of the stack file's `secure:` entries: nothing the kit writes copies them either.
CIPHERTEXTS = {key: f"v1:CIPHER-MARKER-{i}" for i, key in enumerate(SECRET_VALUES)}
MARKERS = [*SECRET_VALUES.values(), "MARKER-3b9f-pull", *CIPHERTEXTS.values()]
EXTRA_ENV = {
    "HF_TOKEN": {"secret": "hf_token"},
    "DB_PASSWORD": {"secretKeyRef": {"name": "db-credentials", "key": "password"}},
    "HCCL_EXEC_TIMEOUT": "204",
}
KIT_SECRETS = {"image-pull-credentials", "model-source-credentials", "simulator-admin-token", ENGINE_ENV_SECRET_NAME}


def _stacks(tmp_path: Path, edit: Any) -> Path:
    """A copy of the stacks directory whose a2-staging config ``edit`` changed (namespaced keys)."""
    target = tmp_path / "stacks"
    shutil.copytree(ROOT / "stacks", target)
    path = target / f"Pulumi.{STACK}.yaml"
    doc = yaml.safe_load(path.read_text())
    edit(doc["config"])
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


def _with_references(config: dict[str, Any]) -> None:
    config[f"{PROJECT}:engine"]["extra_env"] = EXTRA_ENV
    for key, cipher in CIPHERTEXTS.items():
        config[f"{PROJECT}:{key}"] = {"secure": cipher}


def _leaks(text: str) -> list[str]:
    return [m for m in MARKERS if m in text]


def _program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Any = _with_references,
             secrets: dict[str, str] | None = None) -> Run:
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(_stacks(tmp_path, edit)))
    values = SECRET_VALUES if secrets is None else secrets
    config = {f"{PROJECT}:{k}": v for k, v in values.items()}
    return run_stack(STACK, config, secret_keys=list(config))


def test_secrets_reach_only_the_kits_secret_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capfd: pytest.CaptureFixture[str],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    run = _program(tmp_path, monkeypatch)
    assert run.error is None, run.error
    objs = run.k8s_objects
    # positive control: the values are there, in the kit's Secrets, as Pulumi secrets
    env_secret = next(o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] == ENGINE_ENV_SECRET_NAME)
    assert env_secret["stringData"] == {"hf_token": SECRET_VALUES["hf_token"]}
    raw = next(r.inputs for r in run.resources if r.name == f"deepseek/{ENGINE_ENV_SECRET_NAME}")
    assert SECRET_SIG in json.dumps(raw["stringData"], default=str)
    kit_secret_data = "\n".join(str(v) for o in objs if o["kind"] == "Secret"
                                and o["metadata"]["name"] in KIT_SECRETS for v in o.get("stringData", {}).values())
    assert set(_leaks(kit_secret_data)) >= set(SECRET_VALUES.values())
    # everything else: every registered resource (the components too), the outputs
    others = []
    for res in run.resources:
        inputs = normalize(res.inputs)
        if res.is_k8s and res.typ == "kubernetes:core/v1:Secret":
            assert inputs["metadata"]["name"] in KIT_SECRETS
            inputs = {k: v for k, v in inputs.items() if k not in ("stringData", "data")}
        others.append(json.dumps(inputs, default=str, sort_keys=True))
    assert others and _leaks("\n".join(others)) == []
    assert _leaks(json.dumps(normalize(run.exports), default=str)) == []
    # the engine pods reference the secrets, the launch scripts only name them
    deployments = [o for o in workload_objects(objs)
                   if o["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"]
    assert deployments and any(o["kind"] == "PodTemplate" for o in deployments)  # LeaderWorkerSet templates too
    for dep in deployments:
        env = {e["name"]: e for e in pod_spec(dep)["containers"][0]["env"]}
        assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": ENGINE_ENV_SECRET_NAME, "key": "hf_token"}}}
        assert env["DB_PASSWORD"] == {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {
            "name": "db-credentials", "key": "password"}}}
        assert env["HCCL_EXEC_TIMEOUT"] == {"name": "HCCL_EXEC_TIMEOUT", "value": "204"}
        kubernetes_validate.validate(dep, "1.30", strict=True)
    kubernetes_validate.validate(env_secret, "1.30", strict=True)
    scripts = "".join(v for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-launch")
                      for v in o["data"].values())
    assert "HF_TOKEN" in scripts and "export HF_TOKEN" not in scripts and "export DB_PASSWORD" not in scripts
    assert "export HCCL_EXEC_TIMEOUT=204" in scripts
    # what the program printed or logged
    out, err = capfd.readouterr()
    assert _leaks(out + err + caplog.text) == []


def test_render_and_plan_output_carry_only_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capfd: pytest.CaptureFixture[str],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    stacks = _stacks(tmp_path, _with_references)
    out = tmp_path / "out"
    assert main(["render", "--stack", STACK, "--stacks-dir", str(stacks), "--out", str(out)]) == 0
    assert main(["plan", "--stack", STACK, "--stacks-dir", str(stacks), "--json"]) == 0
    assert main(["plan", "--stack", STACK, "--stacks-dir", str(stacks)]) == 0
    printed, errors = capfd.readouterr()
    files = {p.relative_to(out).as_posix(): p.read_text() for p in sorted(out.rglob("*")) if p.is_file()}
    assert "plan.json" in files and any(p.startswith("manifests/") for p in files)
    assert _leaks("\n".join(files.values()) + printed + errors + caplog.text) == []
    plan = json.loads(files["plan.json"])
    assert plan["config"]["engine"]["extra_env"] == EXTRA_ENV  # the references, as written
    secret_file = next(text for path, text in files.items() if path.endswith(f"-secret-{ENGINE_ENV_SECRET_NAME}.yaml"))
    assert yaml.safe_load(secret_file)["stringData"] == {"hf_token": secret_placeholder("hf_token")}
    launch = "".join(text for path, text in files.items() if path.startswith("launch/"))
    assert "HF_TOKEN" in launch and "export HF_TOKEN" not in launch


def test_a_referenced_secret_missing_from_pulumi_config_registers_nothing(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {k: v for k, v in SECRET_VALUES.items() if k != "hf_token"}
    run = _program(tmp_path, monkeypatch, secrets=secrets)
    assert type(run.error).__name__ == "ConfigError"
    assert "engine.extra_env.HF_TOKEN" in str(run.error)
    assert f"pulumi config set --secret {PROJECT}:hf_token <value>" in str(run.error)
    assert run.resources == [] and run.exports == {}


PLAINTEXT = "hf_PLAINTEXT-MARKER-91f3"


@pytest.mark.parametrize("edit, path, command", [
    (lambda c: c[f"{PROJECT}:engine"].update(extra_env={"HF_TOKEN": PLAINTEXT}),
     "engine.extra_env.HF_TOKEN", f"pulumi config set --secret {PROJECT}:hf_token <value>"),
    (lambda c: c[f"{PROJECT}:engine"].update(extra_env={"Openai_Api_Key": PLAINTEXT}),
     "engine.extra_env.Openai_Api_Key", f"pulumi config set --secret {PROJECT}:openai_api_key <value>"),
    (lambda c: c[f"{PROJECT}:engine"].update(extra_env={"MY_CREDENTIALS": {"secure": PLAINTEXT}}),
     "engine.extra_env.MY_CREDENTIALS", "pulumi config set --secret ascend-deepseek:<key> <value>"),
    (lambda c: c.update({f"{PROJECT}:image_pull_credentials": PLAINTEXT}),
     "image_pull_credentials", f"pulumi config set --secret {PROJECT}:image_pull_credentials <value>"),
    (lambda c: c.update({f"{PROJECT}:model_source_credentials": PLAINTEXT}),
     "model_source_credentials", f"pulumi config set --secret {PROJECT}:model_source_credentials <value>"),
    (lambda c: c.update({f"{PROJECT}:registry_password": PLAINTEXT}),
     "registry_password", f"pulumi config set --secret {PROJECT}:registry_password <value>"),
    (lambda c: c[f"{PROJECT}:engine"].update(extra_env={"HF_TOKEN": {"secret": "hf_token"}}),
     "engine.extra_env.HF_TOKEN", f"pulumi config set --secret {PROJECT}:hf_token <value>"),  # not set in the stack
], ids=["extra-env", "extra-env-any-case", "nested-secure", "image-pull", "model-source", "other-key",
        "undeclared-reference"])
def test_plaintext_secrets_are_refused(edit: Any, path: str, command: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    stacks = _stacks(tmp_path, edit)
    out = tmp_path / "out"
    assert main(["render", "--stack", STACK, "--stacks-dir", str(stacks), "--out", str(out)]) == 2
    printed, errors = capfd.readouterr()
    assert f"{path}:" in errors and command in errors, errors
    assert PLAINTEXT not in printed + errors and "Traceback" not in errors
    assert not out.exists()  # nothing half written
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(stacks))
    run = run_stack(STACK)
    assert type(run.error).__name__ == "ConfigError" and PLAINTEXT not in str(run.error)
    assert run.resources == []


def test_committed_stacks_render_without_secret_references(tmp_path: Path) -> None:
    """Control: the refusal rule leaves ordinary variables alone."""
    stacks = _stacks(tmp_path, lambda c: c[f"{PROJECT}:engine"].update(extra_env={"HCCL_EXEC_TIMEOUT": "204"}))
    assert main(["render", "--stack", STACK, "--stacks-dir", str(stacks), "--out", str(tmp_path / "out")]) == 0
    assert not list((tmp_path / "out").rglob(f"*{ENGINE_ENV_SECRET_NAME}*"))
