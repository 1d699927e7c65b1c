"""Publish an expert map safely: validated first, then atomically.

- :class:`FilePublisher`: temp file in the target's directory, fsync, ``os.replace``,
  fsync of the directory. A crash at any point leaves either the old or the new
  file, never a partial one.
- :class:`ConfigMapPublisher`: read the ConfigMap, replace it with its
  ``metadata.resourceVersion`` as precondition; on 409 Conflict read again and retry.

Both validate every map they are handed (lost expert, unequal slots, ids out
of range, duplicates on a rank) and refuse it with :class:`InvalidExpertMap`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from ascend_runtime.balancer.expert_map import require_valid
from ascend_runtime.files.jsondoc import read_json
from ascend_runtime.files.read import EXPERT_MAP, FileRefused

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """Where maps go. ``publish`` validates, writes, and returns a location string."""

    def publish(self, doc: dict[str, Any]) -> str: ...

    def current(self) -> dict[str, Any] | None: ...


class FilePublisher:
    """Atomic file publisher for ``path`` (the engine's ``expert_map_path``)."""

    def __init__(self, path: str | Path, num_experts: int, ranks: int | None = None, slots: int | None = None) -> None:
        self.path = Path(path)
        self.num_experts, self.ranks, self.slots = num_experts, ranks, slots

    def current(self) -> dict[str, Any] | None:
        """The map now at ``path``, or None if there is none."""
        try:  # the kit's reading door: a regular file of at most 64 MiB, never a FIFO or a device
            return read_json(self.path, EXPERT_MAP, "expert map")
        except FileRefused as exc:
            if exc.missing:
                return None
            raise

    def publish(self, doc: dict[str, Any]) -> str:
        """Validate then atomically replace ``path`` with ``doc``."""
        require_valid(doc, self.num_experts, self.ranks, self.slots)
        data = json.dumps(doc, separators=(",", ":")).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return str(self.path)


class ConfigMapPublisher:
    """Publish to key ``key`` of ConfigMap ``namespace/name`` with optimistic concurrency.

    ``api`` is a ``kubernetes.client.CoreV1Api`` (or anything with the same
    ``read_namespaced_config_map`` / ``replace_namespaced_config_map``).
    """

    def __init__(
        self,
        api: Any,
        name: str,
        namespace: str,
        num_experts: int,
        key: str = "expert_map.json",
        ranks: int | None = None,
        slots: int | None = None,
        retries: int = 5,
        backoff_s: float = 0.05,
    ) -> None:
        self.api, self.name, self.namespace, self.key = api, name, namespace, key
        self.num_experts, self.ranks, self.slots = num_experts, ranks, slots
        self.retries, self.backoff_s = retries, backoff_s

    def current(self) -> dict[str, Any] | None:
        cm = self.api.read_namespaced_config_map(self.name, self.namespace)
        raw = (cm.data or {}).get(self.key)
        return json.loads(raw) if raw else None

    def publish(self, doc: dict[str, Any]) -> str:
        """Validate, then read-modify-replace with a resourceVersion precondition."""
        from kubernetes.client.exceptions import ApiException

        require_valid(doc, self.num_experts, self.ranks, self.slots)
        data = json.dumps(doc, separators=(",", ":"))
        for attempt in range(self.retries + 1):
            cm = self.api.read_namespaced_config_map(self.name, self.namespace)
            cm.data = dict(cm.data or {})
            cm.data[self.key] = data
            # the read object's metadata.resourceVersion is the precondition the API server checks
            if not getattr(cm.metadata, "resource_version", None):
                raise RuntimeError(f"ConfigMap {self.namespace}/{self.name} has no resourceVersion")
            try:
                self.api.replace_namespaced_config_map(self.name, self.namespace, cm)
                return f"configmap/{self.namespace}/{self.name}#{self.key}"
            except ApiException as exc:
                if exc.status != 409 or attempt == self.retries:
                    raise
                log.info("ConfigMap %s/%s changed underneath (409), re-reading", self.namespace, self.name)
                time.sleep(self.backoff_s * (attempt + 1))
        raise AssertionError("unreachable")
