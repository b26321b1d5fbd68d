"""Fuzzers for fusec (issue 13)."""
