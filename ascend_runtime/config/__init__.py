"""Typed stack configuration and host inventory (pydantic v2 models) and their loader."""
