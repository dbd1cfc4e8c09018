"""What an operator reads of a running federation: signed ``GET`` s of the services'
pages (``/v1/state``, ``/v1/inspect``, ``/v1/find``) and the broker queues' depths.
``megha status``, ``top``, ``why`` and the benchmarks read through these.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

from common.config import FederationConfig
from security.access import Access, identity_of_process
from security.tls import process_client_context


def signed_get(cfg: FederationConfig, home: Path, name: str, path: str) -> Any:
    """``GET path`` on process ``name``, signed by the operator; the JSON answer."""
    who = identity_of_process(cfg, name)
    headers = Access.in_home(home, cfg).sign(who, "GET", path, b"", time.time())
    req = urllib.request.Request(cfg.url(name) + path, headers=headers)
    with urllib.request.urlopen(req, timeout=10, context=process_client_context()) as resp:
        return json.loads(resp.read())


def operator_get(
    cfg: FederationConfig, access: Access, name: str, path: str, timeout_s: float = 3.0
) -> dict[str, Any]:
    """``GET path`` on process ``name``, signed as the operator: the JSON answer.  A
    refusal is its JSON body with ``status`` added; an unreachable service
    ``{"error": ...}``."""
    who = identity_of_process(cfg, name)
    headers = access.sign(who, "GET", path, b"", time.time())
    req = urllib.request.Request(cfg.url(name) + path, headers=headers)
    try:
        with urllib.request.urlopen(
            req, timeout=timeout_s, context=process_client_context()
        ) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out
    except urllib.error.HTTPError as err:
        with err:
            try:
                body = json.loads(err.read())
            except ValueError:
                body = {}
        refused: dict[str, Any] = body if isinstance(body, dict) else {}
        refused.setdefault("error", f"HTTP {err.code}")
        refused["status"] = err.code
        return refused
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"error": str(exc)}


def depth_queues(cfg: FederationConfig) -> list[str]:
    """The broker queues whose depth an operator watches: users' submissions, dead letters."""
    return [cfg.user_queue(u.user) for u in cfg.user_configs] + [cfg.dead_letter_queue]


async def queue_depths(conn: Any, names: list[str]) -> dict[str, int]:
    """Messages ready in each queue (-1: not declared yet), on an open connection."""
    depths: dict[str, int] = {}
    for name in names:
        ch = await conn.channel()
        try:
            q = await ch.declare_queue(name, passive=True)
            depths[name] = q.declaration_result.message_count or 0
        except Exception:  # not declared yet
            depths[name] = -1
        finally:
            if not ch.is_closed:
                await ch.close()
    return depths


async def broker_queue_depths(cfg: FederationConfig, access: Access) -> dict[str, int]:
    from runtime import broker

    conn, _ = await broker.connect_any(access.broker_urls())
    try:
        return await queue_depths(conn, depth_queues(cfg))
    finally:
        await conn.close()


Found = tuple[list[dict[str, Any]], dict[str, str]]
"""The GMs' answers that found an id, and the GMs that did not answer (name: why)."""


def find_everywhere(cfg: FederationConfig, access: Access, ident: str) -> Found:
    """Every GM's ``GET /v1/find/{ident}``: the answers that found something, and the
    GMs that did not answer (a 404 ``not_found`` is an answer: nothing there)."""
    found: list[dict[str, Any]] = []
    unanswered: dict[str, str] = {}
    for gm in cfg.gm_ids:
        page = operator_get(cfg, access, gm, f"/v1/find/{quote(ident, safe='')}")
        if "error" not in page:
            found.append(page)
        elif page.get("status") != 404 or page["error"] != "not_found":
            unanswered[gm] = str(page.get("detail") or page["error"])
    return found, unanswered


def _page(cfg: FederationConfig, access: Access, names: list[str]) -> dict[str, Any]:
    """The first of ``names`` (an LM, then its standby) that answers ``/v1/inspect``."""
    page: dict[str, Any] = {"error": "no process"}
    for name in names:
        page = operator_get(cfg, access, name, "/v1/inspect", timeout_s=2.0)
        if "error" not in page:
            return page
    return page


def gather(cfg: FederationConfig, access: Access) -> dict[str, dict[str, dict[str, Any]]]:
    """Every GM's and LM's ``/v1/inspect`` page (``{"error": ...}`` if it did not answer)."""
    gms: dict[str, dict[str, Any]] = {g: _page(cfg, access, [g]) for g in cfg.gm_ids}
    lms: dict[str, dict[str, Any]] = {
        lm: _page(cfg, access, [lm, f"{lm}-standby"] if cfg.lm_standby else [lm])
        for lm in cfg.lm_ids
    }
    return {"gms": gms, "lms": lms}
