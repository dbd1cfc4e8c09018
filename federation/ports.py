"""Whether a TCP port is free before a process is announced to listen there (``megha
up``, ``megha dashboard``)."""

from __future__ import annotations

import socket


def port_free(host: str, port: int) -> bool:
    """Nothing accepts a connection on ``host:port``."""
    with socket.socket() as s:
        return s.connect_ex((host, port)) != 0
