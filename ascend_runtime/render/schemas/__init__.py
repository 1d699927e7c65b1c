"""JSON Schemas of the rendered rank tables (package data)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def load_schema(name: str) -> dict[str, Any]:
    """Load a schema shipped in this package by file name."""
    return json.loads(resources.files(__name__).joinpath(name).read_text())
