"""A loop a service cannot live without dies loudly: its traceback is logged before
the supervisor's group takes the process down for gunicorn to restart it (before, the
process exited with nothing in its log but gunicorn's "Worker exiting")."""

from __future__ import annotations

import asyncio
import logging

import pytest

from runtime.supervisor import Supervisor


async def _broken_loop() -> None:
    await asyncio.sleep(0)
    raise KeyError("the view of lm9")


async def _run_until_the_loop_dies() -> None:
    async with Supervisor("gm0") as sup:
        sup.run_forever(_broken_loop(), "decide loop")
        await asyncio.sleep(5)


def test_a_loop_that_dies_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="megha.runtime")
    with pytest.raises(asyncio.CancelledError):  # the service's task is cancelled
        asyncio.run(_run_until_the_loop_dies())
    (record,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert "gm0: decide loop died" in record.getMessage()
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], KeyError)
