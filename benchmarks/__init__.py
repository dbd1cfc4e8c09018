"""Benchmark scripts: each writes its figures to a file (see README)."""
