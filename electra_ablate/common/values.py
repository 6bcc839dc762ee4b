"""Type tests for config values, shared by the central checks (training/checks.py) and the variant classes
that check their own settings (`config_problems`): YAML's `true` is a bool, never a number."""

from __future__ import annotations

import math


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
