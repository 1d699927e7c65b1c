"""The kit's nesting-depth rule gives the kit's message whatever libyaml is installed."""
from __future__ import annotations

import pytest
import yaml

from ascend_runtime.config import loader
from ascend_runtime.config.errors import ConfigError

DEEP_DOCUMENTS = {
    "flow-lists": "key: " + "[" * 5000 + "]" * 5000 + "\n",
    "flow-mappings": "key: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
    "block-lists": "key:\n" + "- " * 3000 + "x\n",
}


class _ScannerWithItsOwnLimit(yaml.SafeLoader):
    """A loader whose scanner stops at 100 levels with wording of its own, as libyaml does in PyYAML 6.0.4
    (at 1,000 levels, scanning ahead of the parser)."""

    def fetch_flow_collection_start(self, token_class):  # noqa: D102 (PyYAML's scanner hook)
        if self.flow_level >= 100:
            raise yaml.scanner.ScannerError(None, None, "exceeded maximum nesting depth", self.get_mark())
        super().fetch_flow_collection_start(token_class)


@pytest.mark.parametrize("loader_class", [getattr(yaml, "CSafeLoader", yaml.SafeLoader), yaml.SafeLoader,
                                          _ScannerWithItsOwnLimit], ids=["libyaml", "python", "own-limit"])
@pytest.mark.parametrize("name", sorted(DEEP_DOCUMENTS))
def test_deep_documents_get_the_kits_message(monkeypatch, loader_class, name):
    monkeypatch.setattr(loader, "_SAFE_LOADER", loader_class)
    with pytest.raises(ConfigError) as raised:
        loader.parse_yaml(DEEP_DOCUMENTS[name], "stack", "stacks/Pulumi.x.yaml")
    text = str(raised.value)
    assert f"more than {loader.MAX_YAML_DEPTH} levels" in text and "nested too deeply at line " in text, text
    assert "stacks/Pulumi.x.yaml" in text and "exceeded" not in text, text


def test_the_position_is_where_the_limit_is_passed():
    text = "a: 1\nkey: " + "[" * 200 + "]" * 200 + "\n"
    mark = loader.too_deep_at(text)
    # the document's own mapping is the first level, so the 64th "[" is one too many
    assert (mark.line, mark.column) == (1, 5 + loader.MAX_YAML_DEPTH - 1), (mark.line, mark.column)
    assert loader.too_deep_at("key: " + "[" * 63 + "]" * 63) is None


def test_a_syntax_error_stays_a_syntax_error(monkeypatch):
    monkeypatch.setattr(loader, "_SAFE_LOADER", _ScannerWithItsOwnLimit)
    with pytest.raises(ConfigError) as raised:
        loader.parse_yaml("key: [1, 2\n", "stack")
    assert "not valid YAML" in str(raised.value) and "nested" not in str(raised.value)
