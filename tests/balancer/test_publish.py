import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
from kubernetes.client.exceptions import ApiException

from ascend_runtime.balancer.expert_map import InvalidExpertMap, placement_to_map
from ascend_runtime.balancer.publish import ConfigMapPublisher, FilePublisher

OLD = placement_to_map(np.array([[0, 1, 2, 3]]), 2)
NEW = placement_to_map(np.array([[3, 2, 1, 0]]), 2)
LOSING = placement_to_map(np.array([[0, 1, 2, 2]]), 2)


def test_file_publisher_refuses_a_map_losing_an_expert(tmp_path):
    pub = FilePublisher(tmp_path / "map.json", 4)
    pub.publish(OLD)
    with pytest.raises(InvalidExpertMap, match="loses logical experts"):
        pub.publish(LOSING)
    assert json.loads((tmp_path / "map.json").read_text()) == OLD


def test_crash_before_rename_leaves_old_map(tmp_path, monkeypatch):
    pub = FilePublisher(tmp_path / "map.json", 4)
    pub.publish(OLD)

    def boom(*_):
        raise OSError("simulated crash between write and rename")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        pub.publish(NEW)
    assert json.loads((tmp_path / "map.json").read_text()) == OLD
    assert os.listdir(tmp_path) == ["map.json"]  # temp file cleaned up


def test_killed_process_between_write_and_rename_leaves_old_map(tmp_path):
    target = tmp_path / "map.json"
    FilePublisher(target, 4).publish(OLD)
    script = textwrap.dedent(f"""
        import os, signal, numpy as np
        from ascend_runtime.balancer.expert_map import placement_to_map
        from ascend_runtime.balancer.publish import FilePublisher
        os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        FilePublisher({str(target)!r}, 4).publish(placement_to_map(np.array([[3, 2, 1, 0]]), 2))
    """)
    proc = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert proc.returncode == -9
    assert json.loads(target.read_text()) == OLD


class FakeCoreV1Api:
    """Test double of kubernetes.client.CoreV1Api: one 409 Conflict, then success."""

    def __init__(self, conflicts=1):
        self.version = 1
        self.data = {"expert_map.json": json.dumps(OLD)}
        self.conflicts = conflicts
        self.reads = 0
        self.replaced_with_versions = []

    def read_namespaced_config_map(self, name, namespace):
        self.reads += 1
        return SimpleNamespace(metadata=SimpleNamespace(name=name, resource_version=str(self.version)), data=dict(self.data))

    def replace_namespaced_config_map(self, name, namespace, body):
        self.replaced_with_versions.append(body.metadata.resource_version)
        if self.conflicts:
            self.conflicts -= 1
            self.version += 1  # someone else wrote in between
            raise ApiException(status=409, reason="Conflict")
        assert body.metadata.resource_version == str(self.version)
        self.data = body.data
        self.version += 1
        return body


def test_configmap_conflict_is_retried_with_fresh_read():
    api = FakeCoreV1Api(conflicts=1)
    pub = ConfigMapPublisher(api, "expert-map", "ds", 4, backoff_s=0)
    pub.publish(NEW)
    assert api.reads == 2
    assert api.replaced_with_versions == ["1", "2"]
    assert json.loads(api.data["expert_map.json"]) == NEW
    assert pub.current() == NEW


def test_configmap_publisher_refuses_bad_map_and_gives_up_on_other_errors():
    api = FakeCoreV1Api(conflicts=0)
    with pytest.raises(InvalidExpertMap):
        ConfigMapPublisher(api, "expert-map", "ds", 4).publish(LOSING)
    assert api.reads == 0
    api.replace_namespaced_config_map = lambda *a: (_ for _ in ()).throw(ApiException(status=403))
    with pytest.raises(ApiException):
        ConfigMapPublisher(api, "expert-map", "ds", 4).publish(NEW)
