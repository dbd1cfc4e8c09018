"""Argument types the sub-commands share, so one flag is checked alike everywhere
(``megha simulate`` and ``megha bench`` / ``demo``: counts, scales; ports)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

Number = TypeVar("Number", int, float)


def ranged(
    convert: Callable[[str], Number], what: str, *, zero: bool = False, most: float = math.inf
) -> Callable[[str], Number]:
    """An argparse type: ``convert(text)``, finite, > 0 (>= 0 with ``zero``) and at most
    ``most`` (``what`` names the kind)."""
    low = ">= 0" if zero else "> 0"
    bound = low if most == math.inf else f"in [0, {most:g}]" if zero else f"in (0, {most:g}]"

    def parse(text: str) -> Number:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero) or value > most:
            raise argparse.ArgumentTypeError(f"must be {what} {bound}, got {text!r}")
        return value

    return parse


def positive(convert: Callable[[str], Number], what: str) -> Callable[[str], Number]:
    """An argparse type: ``convert(text)``, finite and > 0 (``what`` names the kind)."""
    return ranged(convert, what)


positive_int = positive(int, "an integer")
positive_float = positive(float, "a finite number")


PORT_RANGE = (1, 65535)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 1..65535."""
    low, high = PORT_RANGE
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not low <= port <= high:
        raise argparse.ArgumentTypeError(f"a port is in {low}..{high}, got {text!r}")
    return port
