"""Benchmarks; each script writes its own section of docs/benchmarks.md."""
