"""Argument types the sub-commands share, so one flag is checked alike everywhere
(``megha simulate`` and ``megha bench`` / ``demo``: counts, scales; ports; a published
trace's files and format)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from common.errors import ConfigError
from workload import PUBLISHED

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


def published_trace_arguments(p: Any) -> None:
    """``FILE...``, ``--trace-format`` and ``--trace-lookahead`` (a parser or a group of
    one): a published trace, read as it is replayed (``workload.published``)."""
    p.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="a published trace's files, in time order (with --trace-format; gzip, plain CSV "
        "or a tar of them)",
    )
    p.add_argument(
        "--trace-format",
        choices=("megha", *PUBLISHED),
        default="megha",
        help="megha: --trace is a ../shared/traces file (read whole); google2011: "
        "task_events; google2019: instance_events exported to CSV with its header; "
        "alibaba2018: batch_task (DAG jobs); the last three are FILEs read as they are "
        "replayed",
    )
    p.add_argument(
        "--trace-lookahead",
        type=positive_float,
        default=86_400.0,
        help="google2011/2019: a task still running this many trace seconds after its job "
        "arrived is cut there (what the reader holds in memory is at most this span)",
    )


def check_trace_files(fmt: str, files: Sequence[str], trace: str | None) -> None:
    """``ConfigError`` unless a published format comes with its FILEs and FILEs with
    their format."""
    if fmt != "megha" and not (files or trace):
        raise ConfigError(f"--trace-format {fmt} needs the trace's FILEs", reason="missing_trace")
    if files and fmt == "megha":
        raise ConfigError(
            "FILE arguments are a published trace's: give --trace-format "
            f"({', '.join(PUBLISHED)}), or --trace FILE for the ../shared/traces format",
            reason="missing_trace",
        )
