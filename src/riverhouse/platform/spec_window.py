"""A spec's time windows: `90s`, `30m`, `1h`, `7d`, `1w`, at most 7 days (dedup, joins, lateness)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

WINDOW_RE = re.compile(r"\s*(\d+)\s*(s|m|h|d|w)\s*")
MAX_WINDOW = timedelta(days=7)
WINDOW_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
WINDOW_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_window(value: Any) -> timedelta:
    """'90s', '30m', '1h', '7d', '1w' -> timedelta; must be > 0 and <= 7 days."""
    if isinstance(value, timedelta):
        window = value
    else:
        text = str(value)
        match = WINDOW_RE.fullmatch(text) if len(text) <= 40 else None
        if not match:
            raise ValueError(
                f"window {text[:40]!r} is not a duration: write a number and a unit, e.g. 30s, 15m, 1h, 7d"
            )
        number, unit = match.group(1), match.group(2)
        # Compared in whole seconds before a timedelta is built: timedelta(days=10**20) raises OverflowError.
        if int(number) * WINDOW_SECONDS[unit] > MAX_WINDOW.total_seconds():
            raise ValueError(f"window {value!r} is longer than the maximum of 7 days")
        window = timedelta(**{WINDOW_UNITS[unit]: int(number)})
    if window <= timedelta(0):
        raise ValueError(f"window {value!r} must be longer than 0")
    if window > MAX_WINDOW:
        raise ValueError(f"window {value!r} is longer than the maximum of 7 days")
    return window


def format_window(window: timedelta) -> str:
    """timedelta -> the largest exact unit in spec syntax (3600s -> '1h')."""
    seconds = int(window.total_seconds())
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


Window = Annotated[timedelta, BeforeValidator(parse_window), PlainSerializer(format_window, return_type=str)]
