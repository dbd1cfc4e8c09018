"""What a GM reads of a job delivery before it decodes it: who sent it, and whether
its shape is one a job can have.

A GM checks a submission's credentials before it decodes anything, and decodes only
a body whose msgpack containers are as many as a job can hold:

* ``peek`` reads the envelope and the top-level fields ``job_id``, ``user``,
  ``token`` and ``resumes`` (scalars, bounded) and *skips* every other field in msgpack's C code,
  which builds no object for what it skips.  A body of 8 MiB costs a pass over its
  bytes, no allocation;
* ``check_containers`` refuses a body of more msgpack containers (maps, arrays)
  than a valid ``SubmitJob`` can have (``MAX_CONTAINERS``).  An 8 MiB body of empty
  maps decoded to 581 MiB and held the interpreter 1.8 s; a container costs ~90
  bytes of memory per byte of body, other values 1-20.  A count of the bytes that
  may open a container is an upper bound found at C speed; only a body over it is
  counted exactly, each container dropped as it is made.

Neither trusts what it reads for more than the check it makes: the decoded job is
compared with the peeked fields afterwards (``matches``).  ``check_submitter`` proves
the sender from the peeked fields alone.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import msgpack

from common.errors import DecodeError, Unauthorized
from common.messages import MAX_JOB_TASKS, MAX_STAGES, SubmitJob
from runtime import broker as amqp
from security import sealing
from security.identity import Identity
from security.tokens import TokenStore

SUBMIT_TAG = "submit_job"
MAX_FIELDS = 32
"""Top-level fields a submission may have (it declares 9)."""
MAX_SCALAR = 4096
"""Characters of a peeked scalar (ids are at most 128, tokens 256)."""
TASK_CONTAINERS = 3
"""Containers of one task: its map, its demand, its command."""
STAGE_CONTAINERS = 2
"""Containers of one stage: its map, its parents."""
MAX_CONTAINERS = 8 + TASK_CONTAINERS * MAX_JOB_TASKS + STAGE_CONTAINERS * MAX_STAGES
"""The most containers a valid submission holds (320,008): its envelope, fields, task
and stage lists, and each task's and stage's own."""

_OPENERS = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
"""Bytes that begin a msgpack map or array (fixmap, fixarray, array 16/32, map 16/32)."""
_OTHERS = bytes(b for b in range(256) if b not in _OPENERS)


@dataclass(frozen=True, slots=True)
class Head:
    """The fields of a submission read without decoding it."""

    job_id: str
    user: str
    token: str
    resumes: str | None
    """Set on tasks a GM returned to the queue (sealed by it, not by a token)."""

    def matches(self, job: SubmitJob) -> bool:
        """The decoded job says what was peeked (a map that names a field twice decodes to
        its last value: such a body could show the check one token and the core another)."""
        seen = (self.job_id, self.user, self.token, self.resumes)
        return (job.job_id, job.user, job.token, job.resumes) == seen


def _scalar(unpacker: msgpack.Unpacker, name: str, *, nil: bool = False) -> str | None:
    try:
        value = unpacker.unpack()
    except (ValueError, msgpack.ExtraData, msgpack.OutOfData) as exc:
        raise DecodeError(f"field {name!r} is not a short string: {exc}") from None
    if not isinstance(value, str) and not (nil and value is None):
        raise DecodeError(f"field {name!r} is not a string")
    return value


def peek(body: bytes) -> Head:
    """The submission's ``job_id``, ``user``, ``token`` and ``resumes``, read without
    building anything else (``DecodeError`` if the body is no submission)."""
    u = msgpack.Unpacker(
        raw=False, max_buffer_size=max(len(body), 1), max_str_len=MAX_SCALAR, max_bin_len=0,
        max_array_len=0, max_map_len=0, max_ext_len=0,
    )  # fmt: skip
    u.feed(body)
    found: dict[str, str | None] = {"resumes": None}
    seen: set[str] = set()
    try:
        if u.read_array_header() != 3 or u.unpack() != SUBMIT_TAG:
            raise DecodeError('not a submission (["submit_job", version, fields])')
        u.skip()  # the version: the decoder checks it
        fields = u.read_map_header()
        if fields > MAX_FIELDS:
            raise DecodeError(f"{fields} fields, at most {MAX_FIELDS}")
        for _ in range(fields):
            name = _scalar(u, "a field name")
            if name in ("job_id", "user", "token", "resumes"):
                if name in seen:  # a decoder keeps the last: which would the check see?
                    raise DecodeError(f"field {name!r} given twice", reason="ambiguous_fields")
                seen.add(name)
                found[name] = _scalar(u, name, nil=name == "resumes")
            else:
                u.skip()
    except (ValueError, TypeError, msgpack.OutOfData, msgpack.ExtraData) as exc:
        raise DecodeError(f"not a submission: {type(exc).__name__}: {exc}") from None
    missing = [f for f in ("job_id", "user", "token") if f not in found]
    if missing:
        raise DecodeError(f"no {', '.join(missing)} field", reason="missing_field")
    job_id, user, token = (str(found[f]) for f in ("job_id", "user", "token"))
    return Head(job_id, user, token, found["resumes"])


def check_submitter(
    user: str, head: Head, msg: amqp.Delivery, resume_keys: Mapping[Identity, bytes],
    tokens: TokenStore,
) -> None:  # fmt: skip
    """A job in ``user``'s queue is ``user``'s, with its current token -- or tasks its GM
    returned to the queue itself (sealed by it: ``resume_keys``).  Read off the body's
    first fields (``peek``): nothing of an unproven sender's job is decoded."""
    if head.user != user:
        raise Unauthorized(
            f"job of user {head.user!r} found in the queue of {user!r}", reason="wrong_queue"
        )
    if head.resumes is not None:
        stream = f"resume.{user}"
        seal = sealing.authenticate(msg.headers, msg.body, resume_keys, stream)
        if isinstance(seal, sealing.Dropped):
            raise Unauthorized(f"returned tasks not sealed by this GM: {seal.detail}",
                               reason=seal.reason.value)  # fmt: skip
        return
    tokens.refresh(time.time())
    tokens.verify(user, head.token)


class _TooMany(Exception):
    pass


def count_containers(body: bytes, limit: int) -> int:
    """The msgpack containers of ``body``, counted up to ``limit + 1`` (then it stops):
    each is dropped as soon as it is made."""
    n = 0

    def seen(_: object) -> None:
        nonlocal n
        n += 1
        if n > limit:
            raise _TooMany

    try:
        msgpack.unpackb(
            body, raw=False, list_hook=seen, object_pairs_hook=seen, strict_map_key=False,
            max_str_len=1 << 20, max_bin_len=1 << 20, max_array_len=1 << 20,
            max_map_len=1 << 20, max_ext_len=0,
        )  # fmt: skip
    except _TooMany:
        return limit + 1
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"not valid msgpack: {type(exc).__name__}: {exc}") from None
    return n


def check_containers(body: bytes, limit: int = MAX_CONTAINERS) -> None:
    """``DecodeError`` (``too_many_containers``) unless ``body`` holds at most ``limit``
    msgpack containers."""
    if len(body.translate(None, _OTHERS)) <= limit:  # an upper bound, at C speed
        return
    if count_containers(body, limit) > limit:
        raise DecodeError(
            f"more than {limit} msgpack maps and arrays: more than a job can hold",
            reason="too_many_containers",
        )


MAX_DAG_EDGES = 100_000
"""Parent references a DAG job may hold in all (ten a stage at ``MAX_STAGES``).  The
schema bounds stages and parents per stage, not their product: a 2,000-stage job with
every stage after all before it (2 M references, 5.5 MB on the wire, 2,000 tasks: far
within ``max_user_tasks``) took ~90 MB of a GM's memory until it ended (ten of them
grew a GM from 57 to 951 MB), a second of its loop to admit, and under Carbyne seconds
of every plan made while it lived (``common.dag.children_of`` on each)."""


def dag_edges_error(job: SubmitJob) -> tuple[str, str] | None:
    """Why ``job``'s stages are too many edges for a GM to hold (None: they are not)."""
    if job.stages is None:
        return None
    edges = sum(len(s.parents) for s in job.stages)
    if edges <= MAX_DAG_EDGES:
        return None
    return "too_many_edges", (
        f"job {job.job_id!r}: its stages name {edges} parents in all, "
        f"more than {MAX_DAG_EDGES} (MAX_DAG_EDGES)"
    )
