"""What a GM does with a job delivery before it decodes it (issue 32, item 1): the
sender's token is checked on the body's first fields, read without decoding the rest;
a body of more msgpack containers than a job can hold is refused before it is built;
AMQP properties over a small bound are never parsed, never copied into a dead letter,
and counted with the body against the user's backlog.  No broker: the service is
built, not started."""

from __future__ import annotations

import asyncio
import struct
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
from pamqp import frame, header

from common import codec
from common.config import FederationConfig
from common.errors import DecodeError, MeghaError
from common.ids import GmId, JobId, UserId
from common.messages import SubmitJob
from global_master import app as gm_app
from global_master import intake
from global_master.app import GmService
from runtime import broker
from runtime.broker import Broker, Exchanges
from security.access import Access
from security.identity import gm
from security.secret import Secret
from security.tokens import TokenStore
from tests.conftest import make_task

CFG = FederationConfig().validate()
SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
U0 = UserId("u0")


@dataclass
class Delivery:
    """What the service reads of a broker delivery."""

    body: bytes = b""
    redelivered: bool = False
    headers: dict[str, Any] = field(default_factory=dict)
    acked: bool = False

    async def ack(self) -> None:
        self.acked = True


class Kept:
    """An exchange that keeps what it is given, encoded as the channel would send it."""

    def __init__(self) -> None:
        self.published: list[Any] = []

    async def publish(self, message: Any, routing_key: str, **_: Any) -> None:
        header.ContentHeader(body_size=len(message.body), properties=message.properties).marshal()
        self.published.append(message)


def service(home: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[GmService, str, Kept]:
    monkeypatch.setenv("MEGHA_RUN_DIR", str(home / "run"))
    store = TokenStore.in_home(home)
    token = store.add("u0", gm="gm0", share=1.0, now=0.0)
    svc = GmService(CFG, GmId("gm0"), Access(gm("gm0"), CFG, SECRET, users_file=store.path))
    dlx = Kept()
    svc.broker._ex = Exchanges(dlx, dlx, dlx, dlx)  # type: ignore[arg-type]
    return svc, token, dlx


def job_body(token: str, job: str = "j", user: str = "u0") -> bytes:
    task = make_task(job=job, user=user)
    msg = SubmitJob(job_id=JobId(job), user=UserId(user), token=token, submitted_at=0.0,
                    tasks=(task,))  # fmt: skip
    return codec.encode(msg)


def empty_maps(token: str, arrays: int) -> bytes:
    """A submission whose tasks are ``arrays`` arrays of a million empty maps each
    (~1 MiB of body each): valid msgpack, 90 bytes of memory per byte decoded."""
    fields = {"job_id": "bomb", "user": "u0", "token": token, "submitted_at": 0.0,
              "tasks": [[{}] * ((1 << 20) - 1) for _ in range(arrays)]}  # fmt: skip
    out: bytes = msgpack.packb(["submit_job", codec.SCHEMA_VERSION, fields])
    return out


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every body the GM service decodes (its size)."""
    seen: list[int] = []
    real = codec.decode

    def recording(data: bytes, **kw: Any) -> Any:
        seen.append(len(data))
        return real(data, **kw)

    monkeypatch.setattr(gm_app.codec, "decode", recording)
    return seen


def read(svc: GmService, msg: Delivery) -> None:
    asyncio.run(svc._read_job(U0, msg))  # type: ignore[arg-type]


# ----------------------------------------------------------------- the token first
@pytest.mark.parametrize(
    ("token", "reason"),
    [("forged", "bad_token"), ("", "bad_token"), ("mgu_" + "A" * 43, "bad_token")],
)
def test_a_job_with_a_bad_token_is_refused_before_it_is_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[int], token: str, reason: str
) -> None:
    svc, _, _ = service(tmp_path, monkeypatch)
    with pytest.raises(MeghaError) as refused:
        read(svc, Delivery(job_body(token)))
    assert refused.value.reason == reason
    assert decodes == []  # not a byte of it decoded


def test_a_bomb_without_the_token_costs_no_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[int]
) -> None:
    """An 8 MiB body of empty maps took 581 MiB and held the interpreter 1.8 s before the
    token was looked at.  Refused on its token, it costs a skip over its bytes."""
    svc, _, _ = service(tmp_path, monkeypatch)
    bomb = empty_maps("forged", 7)
    tracemalloc.start()
    try:
        with pytest.raises(MeghaError) as refused:
            read(svc, Delivery(bomb))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.reason == "bad_token"
    assert decodes == []
    assert peak < 3 * len(bomb), peak  # the body's copy in the peek, nothing built


def test_a_bomb_with_the_token_is_refused_before_it_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decodes: list[int]
) -> None:
    svc, token, _ = service(tmp_path, monkeypatch)
    bomb = empty_maps(token, 7)
    assert len(bomb) <= CFG.max_body
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as refused:
            read(svc, Delivery(bomb))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.reason == "too_many_containers"
    assert decodes == []
    assert peak < 64 * 1024 * 1024, peak  # decoded, it was ~500 MiB


def test_a_good_job_and_the_largest_job_pass_the_container_count() -> None:
    intake.check_containers(job_body("t"))
    tasks = [{"task_id": f"t{i}", "demand": [1], "command": []} for i in range(10_000)]
    big: bytes = msgpack.packb(["submit_job", 2, {"tasks": tasks * 10}])  # 100,000 tasks
    intake.check_containers(big)  # 300,003 containers: within a job's 320,008
    assert intake.count_containers(big, 10**7) == 300_003


def test_the_token_the_check_saw_is_the_one_the_job_carries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A map that names ``token`` twice decodes to its last value: the check must not
    pass one token and the core hold another."""
    svc, token, _ = service(tmp_path, monkeypatch)
    fields = msgpack.unpackb(job_body(token))[2]
    pairs = b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in fields.items())
    twice = pairs + msgpack.packb("token") + msgpack.packb("other")
    body = msgpack.packb("submit_job")
    raw = b"\x93" + body + msgpack.packb(2) + b"\xde" + struct.pack(">H", len(fields) + 1) + twice
    with pytest.raises(DecodeError) as refused:
        read(svc, Delivery(raw))
    assert refused.value.reason == "ambiguous_fields"


def test_the_peek_reads_the_fields_whatever_their_order() -> None:
    fields = msgpack.unpackb(job_body("tok"))[2]
    reordered = dict(reversed(list(fields.items())))
    head = intake.peek(msgpack.packb(["submit_job", 2, reordered]))
    assert (head.job_id, head.user, head.token, head.resumes) == ("j", "u0", "tok", None)
    for bad in (b"\xc1", msgpack.packb(["launch", 2, {}]), msgpack.packb(["submit_job", 2, 3])):
        with pytest.raises(DecodeError):
            intake.peek(bad)
    with pytest.raises(DecodeError):  # a token that is a container is not read
        intake.peek(msgpack.packb(["submit_job", 2, {**fields, "token": [1] * 100}]))


# ------------------------------------------------------------- AMQP properties
HEADERS_FLAG = b"\x20\x00"


def delivered(table: bytes, body: bytes = b"job") -> header.ContentHeader:
    """The content header of a delivery carrying header table ``table``, as the AMQP
    client reads it off the wire."""
    payload = struct.pack(">HHQ", 60, 0, len(body)) + HEADERS_FLAG + struct.pack(">I", len(table))
    payload += table
    wire = struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    _, _, got = frame.unmarshal(wire)
    assert isinstance(got, header.ContentHeader)
    return got


def long_strings(total: int, each: int = 1000) -> bytes:
    out = b""
    i = 0
    while len(out) < total:
        name = f"h{i}".encode()
        out += bytes([len(name)]) + name + b"S" + struct.pack(">I", each) + b"x" * each
        i += 1
    return out


def test_a_header_table_over_the_bound_is_never_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 122 KiB table cost ~100 ms of CPU to parse, per delivery, before any check."""
    parsed: list[int] = []
    real = broker._read_content_header

    def counting(self: header.ContentHeader, data: bytes) -> None:
        parsed.append(len(data))
        real(self, data)

    monkeypatch.setattr(broker, "_read_content_header", counting)
    got = delivered(long_strings(120 * 1024))
    assert parsed == []
    headers = got.properties.headers or {}
    assert set(headers) == {broker.TOO_LARGE_HEADER}
    assert headers[broker.TOO_LARGE_HEADER] > broker.MAX_PROPERTIES_BYTES
    small = delivered(long_strings(2000))
    assert len(parsed) == 1
    assert (small.properties.headers or {})[broker.PROPERTIES_BYTES_HEADER] > 2000


def _consume_one(b: Broker, headers: dict[str, Any]) -> tuple[list[object], Delivery]:
    handled: list[object] = []

    async def handler(msg: object) -> None:
        handled.append(msg)

    msg = Delivery(b"job", headers=headers)
    asyncio.run(b.guarded("fed.user.u0", handler)(msg))  # type: ignore[arg-type]
    return handled, msg


def test_a_delivery_with_too_large_properties_is_dead_lettered_unhandled() -> None:
    b = Broker(CFG, "gm0")
    dlx = Kept()
    b._ex = Exchanges(dlx, dlx, dlx, dlx)  # type: ignore[arg-type]
    props = delivered(long_strings(120 * 1024)).properties.headers
    handled, msg = _consume_one(b, dict(props or {}))
    assert handled == []
    (out,) = dlx.published
    assert out.headers[broker.REASON_HEADER] == "headers_too_large"
    assert not any(k.startswith("h") for k in out.headers)
    assert msg.acked


def test_a_dead_letter_copies_a_bounded_part_of_its_headers_and_fits_a_frame() -> None:
    """Headers just under the frame size, copied whole with the reason's, made a dead
    letter too large for one frame: the broker closed the GM's connection, and the
    message, redelivered, closed the next one."""
    b = Broker(CFG, "gm0")
    dlx = Kept()
    b._ex = Exchanges(dlx, dlx, dlx, dlx)  # type: ignore[arg-type]
    props = delivered(long_strings(15 * 1024)).properties.headers or {}
    assert broker.TOO_LARGE_HEADER not in props  # under the bound: read
    msg = Delivery(b"job", headers=dict(props))
    asyncio.run(b.dead_letter(msg, "fed.user.u0", "bad_token", "x" * 400))  # type: ignore[arg-type]
    (out,) = dlx.published
    size = len(header.ContentHeader(body_size=3, properties=out.properties).marshal())
    assert size < broker.DEAD_LETTER_HEADERS + 2048
    assert out.headers[broker.DROPPED_HEADERS] >= 7
    assert broker.PROPERTIES_BYTES_HEADER not in out.headers
    assert msg.acked


def test_a_users_backlog_counts_the_headers_of_its_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, token, _ = service(tmp_path, monkeypatch)
    body = job_body(token)
    held: list[int] = []

    async def reading(user: UserId, msg: Delivery) -> None:
        held.append(svc.unread.waiting(user))

    monkeypatch.setattr(svc, "_read_job", reading)
    msg = Delivery(body, headers={broker.PROPERTIES_BYTES_HEADER: 12_000})
    asyncio.run(svc._on_job(U0, msg))  # type: ignore[arg-type]
    assert held == [len(body) + 12_000]
