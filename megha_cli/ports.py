"""TCP ports on the command line: a port number argparse checks, and whether a port is
free before a command announces it will listen there (``megha up``, ``megha dashboard``)."""

from __future__ import annotations

import argparse
import socket

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


def port_free(host: str, port: int) -> bool:
    """Nothing accepts a connection on ``host:port``."""
    with socket.socket() as s:
        return s.connect_ex((host, port)) != 0
