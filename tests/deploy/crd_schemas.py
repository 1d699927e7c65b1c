"""JSON Schemas of the custom resources the kit creates (kubernetes-validate knows no CRDs).

Every custom resource is validated against the published CRD schema of a released version of its
project, committed under ``crds/`` with its repository, tag, commit and path (crds/README.md):

* LeaderWorkerSet: kubernetes-sigs/lws, the release the kit pins (``objects/lws.py`` ``RELEASE``);
* PodMonitor, ServiceMonitor, PrometheusRule: prometheus-operator/prometheus-operator :data:`PROMETHEUS_OPERATOR_TAG`
  (``example/prometheus-operator-crd/``), the newest release when they were committed.

The schemas are strict (:func:`strict_json_schema`): an unknown field fails here, where the API
server would silently prune it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

CRD_DIR = Path(__file__).resolve().parent / "crds"
#: The prometheus-operator release whose CRDs the monitors are validated against.
PROMETHEUS_OPERATOR_TAG = "v0.93.0"
PROMETHEUS_OPERATOR_COMMIT = "f8fafd475f3d132e239432ae6172de60a6cb6516"
#: kind -> committed schema file (each names its upstream source).
SCHEMA_FILES = {
    "LeaderWorkerSet": CRD_DIR / "leaderworkerset.x-k8s.io_leaderworkersets.json",
    "PodMonitor": CRD_DIR / "monitoring.coreos.com_podmonitors.json",
    "ServiceMonitor": CRD_DIR / "monitoring.coreos.com_servicemonitors.json",
    "PrometheusRule": CRD_DIR / "monitoring.coreos.com_prometheusrules.json",
}
#: Where each committed Prometheus operator schema comes from in its repository.
PROMETHEUS_CRD_PATHS = {
    "PodMonitor": "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
    "ServiceMonitor": "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
    "PrometheusRule": "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
}
#: ObjectMeta the kit writes on a monitor (a DNS-1123 name, namespace, labels).
_META = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                   "namespace": {"type": "string"},
                   "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                   "annotations": {"type": "object", "additionalProperties": {"type": "string"}}},
    "additionalProperties": False,
}


def validate_crd(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when a custom resource does not fit its published CRD's schema."""
    error = jsonschema.exceptions.best_match(_validator(obj["kind"]).iter_errors(obj))
    if error is not None:
        raise error


# --- committed schemas and their validators ------------------------------------------------------

#: The openAPIV3Schema of the LeaderWorkerSet CRD at the pinned release (descriptions removed), with its source.
LWS_SCHEMA_FILE = SCHEMA_FILES["LeaderWorkerSet"]
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
#: ObjectMeta of a LeaderWorkerSet: its name names the headless Service, a DNS-1035 label
#: (pkg/webhooks/leaderworkerset_webhook.go ``NameIsDNS1035Label``, v0.10.0).
_LWS_META = {**_META, "properties": {**_META["properties"],
                                     "name": {"type": "string", "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$",
                                              "maxLength": 63}}}
_METAS = {"LeaderWorkerSet": _LWS_META}
_NOTE = ("spec.versions[{version}].schema.openAPIV3Schema of the CRD at the commit above, every 'description' "
         "removed (they do not validate); nothing else changed. Regenerate: tests/deploy/crd_schemas.py "
         "committed_schema().")


def schema_from_crd(crd: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    """The committed form of a CRD's schema: the openAPIV3Schema of ``version`` without descriptions."""
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "description"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(served["schema"]["openAPIV3Schema"])


def lws_schema_from_crd(crd: dict[str, Any]) -> dict[str, Any]:
    """The committed form of a LeaderWorkerSet CRD's schema (:func:`schema_from_crd` of ``v1``)."""
    return schema_from_crd(crd, "v1")


def committed_schema(crd: dict[str, Any], source: dict[str, str], version: str = "v1") -> dict[str, Any]:
    """The document a ``crds/*.json`` file holds: group, kind, version, the upstream ``source``
    (repository, tag, commit, path) and the schema. ``json.dumps(doc, indent=1, sort_keys=True)`` writes it."""
    return {"group": crd["spec"]["group"], "kind": crd["spec"]["names"]["kind"], "version": version,
            "source": dict(source), "note": _NOTE.format(version=version),
            "openAPIV3Schema": schema_from_crd(crd, version)}


def strict_json_schema(node: Any) -> Any:
    """A CRD's structural OpenAPI v3 schema as a JSON Schema that also refuses unknown fields.

    The API server prunes unknown fields rather than rejecting them, so a misspelt key would silently
    vanish; here it fails. ``x-kubernetes-preserve-unknown-fields`` keeps a node open;
    ``x-kubernetes-int-or-string`` nodes already carry their ``anyOf``; ``format: int32/int64`` become
    bounds; other ``x-kubernetes-*`` markers and ``default`` do not validate and are dropped.
    """
    if isinstance(node, list):
        return [strict_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_json_schema(v) for k, v in node.items()
           if not k.startswith("x-kubernetes-") and k not in ("default", "format")}
    if node.get("format") in ("int32", "int64") and node.get("type") == "integer":
        low, high = _INT32 if node["format"] == "int32" else _INT64
        out.setdefault("minimum", low)
        out.setdefault("maximum", high)
    if (node.get("type") == "object" and "properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def committed_doc(kind: str) -> dict[str, Any]:
    """The committed schema document of ``kind`` (group, kind, version, source, openAPIV3Schema)."""
    return json.loads(SCHEMA_FILES[kind].read_text())


def crd_json_schema(kind: str) -> dict[str, Any]:
    """JSON Schema of a ``kind`` object: its committed CRD schema, strict about unknown fields, with
    exact apiVersion and kind and the ObjectMeta the kit writes."""
    doc = committed_doc(kind)
    schema = strict_json_schema(doc["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": f"{doc['group']}/{doc['version']}"}
    schema["properties"]["kind"] = {"const": doc["kind"]}
    schema["properties"]["metadata"] = _METAS.get(kind, _META)
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    schema["additionalProperties"] = False
    return schema


def lws_json_schema() -> dict[str, Any]:
    """JSON Schema of a LeaderWorkerSet object of the pinned release (strict about unknown fields)."""
    return crd_json_schema("LeaderWorkerSet")


_VALIDATORS: dict[str, jsonschema.Draft7Validator] = {}


def _validator(kind: str) -> jsonschema.Draft7Validator:
    if kind not in SCHEMA_FILES:
        raise KeyError(f"no committed CRD schema for kind {kind!r} (tests/deploy/crds/README.md)")
    if kind not in _VALIDATORS:
        _VALIDATORS[kind] = jsonschema.Draft7Validator(crd_json_schema(kind))
    return _VALIDATORS[kind]


def validate_lws(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when a LeaderWorkerSet does not fit the pinned CRD's schema."""
    validate_crd(obj)


def main(argv: list[str] | None = None) -> int:
    """Rewrite the committed Prometheus operator schemas from a mirror of prometheus-operator/prometheus-operator
    (``python -m tests.deploy.crd_schemas GIT_DIR``) at :data:`PROMETHEUS_OPERATOR_COMMIT`."""
    import subprocess
    import sys

    import yaml

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.deploy.crd_schemas <git dir of prometheus-operator/prometheus-operator>",
              file=sys.stderr)
        return 2
    for kind, path in PROMETHEUS_CRD_PATHS.items():
        text = subprocess.run(["git", f"--git-dir={args[0]}", "show", f"{PROMETHEUS_OPERATOR_COMMIT}:{path}"],
                              check=True, capture_output=True, text=True).stdout
        source = {"repository": "prometheus-operator/prometheus-operator", "tag": PROMETHEUS_OPERATOR_TAG,
                  "commit": PROMETHEUS_OPERATOR_COMMIT, "path": path}
        doc = committed_schema(yaml.safe_load(text), source)
        SCHEMA_FILES[kind].write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"{SCHEMA_FILES[kind].name}: {PROMETHEUS_OPERATOR_TAG} {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
