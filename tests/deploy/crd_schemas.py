"""JSON Schemas of the custom resources the kit creates (kubernetes-validate knows no CRDs).

Prometheus operator (ServiceMonitor, PodMonitor): minimal schemas of the fields the kit uses.
LeaderWorkerSet: the published CRD schema of the pinned release (``crds/``, with its tag and commit).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

_META = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                   "namespace": {"type": "string"},
                   "labels": {"type": "object", "additionalProperties": {"type": "string"}}},
    "additionalProperties": False,
}
_SELECTOR = {"type": "object", "required": ["matchLabels"],
             "properties": {"matchLabels": {"type": "object", "minProperties": 1,
                                            "additionalProperties": {"type": "string"}}},
             "additionalProperties": False}
_RELABEL = {"type": "object", "properties": {"sourceLabels": {"type": "array", "items": {"type": "string"}},
                                             "targetLabel": {"type": "string"}}, "additionalProperties": False}
_ENDPOINT = {
    "type": "object",
    "required": ["port"],
    "properties": {"port": {"type": "string", "maxLength": 15}, "path": {"type": "string", "pattern": "^/"},
                   "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                   "relabelings": {"type": "array", "items": _RELABEL}},
    "additionalProperties": False,
}


def _crd(kind: str, endpoints_key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _META,
            "spec": {"type": "object", "required": ["selector", endpoints_key],
                     "properties": {"selector": _SELECTOR,
                                    endpoints_key: {"type": "array", "minItems": 1, "items": _ENDPOINT}},
                     "additionalProperties": False},
        },
        "additionalProperties": False,
    }


SCHEMAS = {"ServiceMonitor": _crd("ServiceMonitor", "endpoints"), "PodMonitor": _crd("PodMonitor", "podMetricsEndpoints")}


def validate_crd(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when the object does not fit our minimal schema."""
    jsonschema.validate(obj, SCHEMAS[obj["kind"]])


# --- LeaderWorkerSet: the published CRD schema of the pinned release ---------------------------------

#: The openAPIV3Schema of the LeaderWorkerSet CRD at the pinned release (descriptions removed), with its source.
LWS_SCHEMA_FILE = Path(__file__).resolve().parent / "crds" / "leaderworkerset.x-k8s.io_leaderworkersets.json"
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
#: ObjectMeta of a LeaderWorkerSet: its name names the headless Service, a DNS-1035 label
#: (pkg/webhooks/leaderworkerset_webhook.go ``NameIsDNS1035Label``, v0.10.0).
_LWS_META = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": {"type": "string", "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                   "namespace": {"type": "string"},
                   "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                   "annotations": {"type": "object", "additionalProperties": {"type": "string"}}},
    "additionalProperties": False,
}


def lws_schema_from_crd(crd: dict[str, Any]) -> dict[str, Any]:
    """The committed form of a LeaderWorkerSet CRD's schema: its v1 openAPIV3Schema without descriptions."""
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "description"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(version["schema"]["openAPIV3Schema"])


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


def lws_json_schema() -> dict[str, Any]:
    """JSON Schema of a LeaderWorkerSet object of the pinned release (strict about unknown fields)."""
    doc = json.loads(LWS_SCHEMA_FILE.read_text())
    schema = strict_json_schema(doc["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": f"{doc['group']}/{doc['version']}"}
    schema["properties"]["kind"] = {"const": doc["kind"]}
    schema["properties"]["metadata"] = _LWS_META
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return schema


_LWS_VALIDATOR: jsonschema.Draft7Validator | None = None


def validate_lws(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when a LeaderWorkerSet does not fit the pinned CRD's schema."""
    global _LWS_VALIDATOR
    if _LWS_VALIDATOR is None:
        _LWS_VALIDATOR = jsonschema.Draft7Validator(lws_json_schema())
    error = jsonschema.exceptions.best_match(_LWS_VALIDATOR.iter_errors(obj))
    if error is not None:
        raise error
