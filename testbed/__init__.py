"""Test-bed: (docstring to come)."""
