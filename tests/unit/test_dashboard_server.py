"""The dashboard's poller against a federation whose services and broker are all gone:
it still makes snapshots, every service shown down, and the task search says why."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from common.config import FederationConfig
from megha_cli.dashboard.server import Poller


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # nothing listens once the socket is closed


def test_everything_down_is_shown_down(tmp_path: Path) -> None:
    cfg = replace(
        FederationConfig(),
        gms=1,
        lms=1,
        nodes_per_lm=2,
        broker_url=f"amqp://guest:guest@127.0.0.1:{_closed_port()}/",
        addresses={
            "gm0": f"127.0.0.1:{_closed_port()}",
            "lm0": f"127.0.0.1:{_closed_port()}",
            "lm0-workers": f"127.0.0.1:{_closed_port()}",
        },
    ).validate()

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        poller = Poller(cfg, tmp_path)
        async with aiohttp.ClientSession() as http:
            poller.http = http
            await poller.poll_once()
            await poller.poll_once(metrics=False)
            answer = await poller.task("u0", "t1")
        return json.loads(poller.snapshot), answer

    snap, answer = asyncio.run(run())
    assert snap["counts"] == {"gms": 1, "gms_up": 0, "lms": 1, "lms_up": 0}
    assert snap["broker"] == {"up": False}
    events = {(e["who"], e["what"]) for e in snap["events"]}
    assert ("gm0", "down (connection refused)") in events
    assert ("lm0", "down (connection refused)") in events
    assert ("broker", "down (no TCP connection)") in events
    assert answer["available"] is False
    assert "did not answer" in str(answer["detail"])
