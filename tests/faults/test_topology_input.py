"""`faults watch --topology FILE`: ``npu_resource`` is the device plugin's extended resource name or refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascend_runtime.cli import main
from ascend_runtime.faults.topology import Topology

from .conftest import TOPOLOGY

BAD = [
    (910, "must be a string"),
    (910.0, "must be a string"),
    (True, "must be a string"),
    (["huawei.com/Ascend910"], "must be a string"),
    ({"name": "huawei.com/Ascend910"}, "must be a string"),
    ("", "not an extended resource name"),
    ("Ascend910", "not an extended resource name"),
    ("huawei.com/", "not an extended resource name"),
    ("Huawei.COM/Ascend910", "not an extended resource name"),
    ("huawei.com/Ascend910\nx", "not an extended resource name"),
    ("huawei.com/" + "a" * 64, "not an extended resource name"),
    ("kubernetes.io/npu", "kubernetes.io domain"),
]


def _write(tmp_path: Path, value: object, present: bool = True) -> Path:
    doc = TOPOLOGY.to_dict()
    if present:
        doc["npu_resource"] = value
    else:
        del doc["npu_resource"]
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(doc))
    return path


def test_bad_npu_resource_is_refused_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_PROXY_TOKEN", "t" * 32)
    for value, message in BAD:
        path = _write(tmp_path, value)
        with pytest.raises(ValueError, match="npu_resource") as exc:
            Topology.from_dict(json.loads(path.read_text()))
        assert message in str(exc.value), (value, exc.value)
        rc = main(["faults", "watch", "--topology", str(path), "--proxy", "http://127.0.0.1:1", "--max-cycles", "1"])
        err = capsys.readouterr().err
        assert rc == 2, (value, err)
        assert "--topology" in err and "npu_resource" in err and message in err, (value, err)
        assert "Traceback" not in err and "\nx" not in err  # control characters come out escaped


def test_good_npu_resource_is_kept_and_absent_or_null_is_the_default(tmp_path: Path) -> None:
    for value, present, want in (("huawei.com/Ascend910", True, "huawei.com/Ascend910"),
                                 ("example.org/npu-310p_x.1", True, "example.org/npu-310p_x.1"),
                                 (None, True, "huawei.com/Ascend910"), (None, False, "huawei.com/Ascend910")):
        topo = Topology.from_dict(json.loads(_write(tmp_path, value, present).read_text()))
        assert topo.npu_resource == want
        assert Topology.from_dict(topo.to_dict()) == topo  # what render writes reads back unchanged
