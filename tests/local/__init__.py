"""Tests of the local stack (`up`, `status`, `down`)."""
