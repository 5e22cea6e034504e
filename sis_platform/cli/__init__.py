"""Operator commands (console scripts declared in pyproject.toml)."""
