"""A pool's launch log page (``worker.app.launches_handler``): the msgpack page the
benchmark polls carries the rows as the JSON page does, each a map of
``LAUNCH_FIELDS``, byte for byte what msgpack made of them as dicts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgpack
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from common import codec
from common.config import FederationConfig
from common.ids import LmId
from runtime import http
from security.access import Access
from security.identity import workers
from security.secret import Secret
from worker.app import LAUNCH_FIELDS, WorkerService, launches_handler

SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
CFG = FederationConfig().validate()


def _pages() -> tuple[bytes, dict[str, Any], WorkerService]:
    async def ask() -> tuple[bytes, dict[str, Any], WorkerService]:
        app = web.Application()
        svc = WorkerService(CFG, LmId("lm0"), Access(workers("lm0"), CFG, SECRET))
        svc.core._log(("start", "u0", "j1.t0", 1, 3, 1234.5))
        svc.core._log(("end", "u0", "j1.t0", 1, 3, 1235.25))
        svc.core._log(("stop", "u1", "j2.t7", 2, 0, 1236.0))
        app[http.SERVICE_KEY] = svc
        got = []
        for accept in (http.MSGPACK, "application/json"):
            request = make_mocked_request(
                "GET", "/v1/launches?after=1", headers={"Accept": accept}, app=app
            )
            resp = await launches_handler(request)
            assert isinstance(resp, web.Response)
            assert isinstance(resp.body, bytes)
            got.append(resp.body)
        return got[0], json.loads(got[1]), svc

    return asyncio.run(ask())


def test_the_msgpack_page_is_the_json_page() -> None:
    packed, as_json, _ = _pages()
    page = codec.unpack_plain(packed)
    at = page.pop("at")
    assert isinstance(at, float)
    as_json.pop("at")
    assert page == as_json
    assert [r["task_id"] for r in page["launches"]] == ["j1.t0", "j2.t7"]
    assert page["next"] == 3


def test_the_msgpack_page_is_what_msgpack_made_of_dicts() -> None:
    packed, _, svc = _pages()
    page = msgpack.unpackb(packed)
    rows, _ = svc.core.launches_after(1)
    page["launches"] = [dict(zip(LAUNCH_FIELDS, r, strict=True)) for r in rows]
    assert packed == codec.pack_plain(page)  # (its "at" as read back)
