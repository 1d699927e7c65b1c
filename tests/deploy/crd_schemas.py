"""Minimal JSON Schemas of the Prometheus operator CRDs we create (kubernetes-validate knows no CRDs)."""

from __future__ import annotations

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
