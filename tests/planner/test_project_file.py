"""Pulumi.yaml documents every stack key, exactly as generated from the models."""

from pathlib import Path

import yaml

from ascend_runtime.config.project_doc import project_yaml
from ascend_runtime.config.stack import PROJECT, StackConfig

ROOT = Path(__file__).resolve().parents[2]


def test_pulumi_yaml_is_current() -> None:
    assert (ROOT / "Pulumi.yaml").read_text() == project_yaml(), (
        "regenerate: python -m ascend_runtime.config.project_doc > Pulumi.yaml"
    )


def test_every_key_documented_with_description() -> None:
    doc = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert doc["stackConfigDir"] == "stacks" and doc["runtime"]["name"] == "python"
    for name, field in StackConfig.model_fields.items():
        entry = doc["config"][f"{PROJECT}:{name}"]
        assert entry["description"]
        nested = getattr(field.annotation, "model_fields", None)
        for sub in nested or {}:
            assert f"\n  {sub} (" in entry["description"], (name, sub)
