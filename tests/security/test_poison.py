"""A job that kills its GM never takes it down twice (issue 32, item 1): classic queues
count no deliveries, so a GM killed for memory got the same job first again, and died
again, for ever.  ``runtime.poison`` records each delivery in hand on local disk; the
process that finds a record its predecessor left judges it (``poison`` or ``suspect``).
The last test kills a live GM's worker (SIGKILL, as the OOM killer does) while it
handles one job: gunicorn starts another, which dead-letters that job as ``poison``
and serves the next."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from client import Client
from common.config import FederationConfig
from common.ids import JobId, TaskId, UserId
from common.model import TaskSpec
from request_generator.submitter import Submitter
from runtime import faults
from runtime.poison import PoisonGuard, Verdict, delivery_key
from tests.e2e.conftest import listen_dead_letters
from tests.e2e.conftest import make_federation as make_federation  # the live fixture
from workload.jobs import Job

KEY = delivery_key("fed.user.u0", b"a job")


def die_in_hand(directory: Path, master: str, *keys: str) -> None:
    """A process that takes ``keys`` in hand and dies (SIGKILL) before it is done."""
    code = (
        "import asyncio, os, signal, sys\n"
        "from pathlib import Path\n"
        "from runtime.poison import PoisonGuard\n"
        "async def main():\n"
        f"    g = PoisonGuard(Path({str(directory)!r}), master={master!r})\n"
        f"    hands = [g.handling(k) for k in {list(keys)!r}]\n"
        "    for h in hands:\n"
        "        await h.__aenter__()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, timeout=60)
    assert proc.returncode == -9


def test_a_delivery_in_hand_when_a_worker_died_alone_is_poison(tmp_path: Path) -> None:
    die_in_hand(tmp_path, "master-1", KEY)
    g = PoisonGuard(tmp_path, master="master-1")  # the same master: the worker died alone
    assert g.verdict(KEY, redelivered=True) is Verdict.POISON
    assert g.verdict(KEY, redelivered=False) is Verdict.FRESH  # published anew: not it
    assert g.verdict(delivery_key("fed.user.u0", b"another"), redelivered=True) is Verdict.FRESH
    again = PoisonGuard(tmp_path, master="master-2")  # the verdict waits on disk
    assert again.verdict(KEY, redelivered=True) is Verdict.POISON
    again.settle(KEY)
    assert PoisonGuard(tmp_path, master="m").verdict(KEY, redelivered=True) is Verdict.FRESH


def test_a_whole_service_killed_from_outside_dead_letters_nothing(tmp_path: Path) -> None:
    """``megha kill gm0``, a host restart: the master went too.  What was in hand is a
    suspect, handled again (alone), not thrown away."""
    die_in_hand(tmp_path, "master-1", KEY)
    g = PoisonGuard(tmp_path, master="master-2")
    assert g.verdict(KEY, redelivered=True) is Verdict.SUSPECT


def test_several_in_hand_are_suspects_and_a_suspect_that_kills_again_is_poison(
    tmp_path: Path,
) -> None:
    other = delivery_key("fed.user.u1", b"another job")
    die_in_hand(tmp_path, "master-1", KEY, other)
    g = PoisonGuard(tmp_path, master="master-1")
    assert g.verdict(KEY, redelivered=True) is Verdict.SUSPECT
    assert g.verdict(other, redelivered=True) is Verdict.SUSPECT
    # the suspect is handled alone and kills the process again: poison next time
    code = (
        "import asyncio, os, signal\n"
        "from pathlib import Path\n"
        "from runtime.poison import PoisonGuard, Verdict\n"
        "async def main():\n"
        f"    g = PoisonGuard(Path({str(tmp_path)!r}), master='master-3')\n"
        f"    await g.handling({KEY!r}, Verdict.SUSPECT).__aenter__()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == -9
    g = PoisonGuard(tmp_path, master="master-4")
    assert g.verdict(KEY, redelivered=True) is Verdict.POISON
    assert g.verdict(other, redelivered=True) is Verdict.SUSPECT


def test_a_suspect_is_handled_alone(tmp_path: Path) -> None:
    g = PoisonGuard(tmp_path, master="m")
    order: list[str] = []

    async def hold(name: str, verdict: Verdict, hold_s: float) -> None:
        async with g.handling(name, verdict):
            order.append(f"+{name}")
            await asyncio.sleep(hold_s)
            order.append(f"-{name}")

    async def run() -> None:
        first = asyncio.create_task(hold("a", Verdict.FRESH, 0.05))
        await asyncio.sleep(0.01)
        suspect = asyncio.create_task(hold("s", Verdict.SUSPECT, 0.05))
        await asyncio.sleep(0.01)
        later = asyncio.create_task(hold("b", Verdict.FRESH, 0.01))
        await asyncio.gather(first, suspect, later)

    asyncio.run(run())
    assert order == ["+a", "-a", "+s", "-s", "+b", "-b"]
    assert not list(tmp_path.glob("r-*"))  # every record removed once handled


def test_a_guard_without_a_writable_directory_still_handles(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    g = PoisonGuard(blocked / "run", master="m")

    async def run() -> None:
        async with g.handling(KEY):
            pass

    asyncio.run(run())
    assert g.verdict(KEY, redelivered=True) is Verdict.FRESH


# ---------------------------------------------------------------- a live GM
def _workers_booted(log: Path) -> int:
    return log.read_text(errors="replace").count("Booting worker")


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_a_job_that_kills_its_gm_takes_it_down_once(
    make_federation: Callable[..., tuple[FederationConfig, Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(faults.FAULTS_DIR_ENV, str(tmp_path / "faults"))
    cfg, home = make_federation(gms=1, lms=1, nodes_per_lm=2)
    jid = f"poison-{uuid.uuid4().hex[:6]}"
    faults.inject(tmp_path / "faults", "gm0", "die_on_job", 0).write_text(jid)
    log = home / "logs" / "gm0.log"
    booted = _workers_booted(log)
    reasons, finished = asyncio.run(_poison_then_good(cfg, home, jid))
    assert reasons == ["poison"]
    assert finished
    assert _workers_booted(log) == booted + 1  # killed once, never again
    # its user reads it failed, and why (it was "submitted", then unknown)
    view = Client.connect(user="u0", state_dir=home).status(jid)
    assert view.state == "failed"
    assert view.reason.startswith("poison: gm0 died handling"), view


async def _poison_then_good(cfg: FederationConfig, home: Path, jid: str) -> tuple[list[str], bool]:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    reasons: list[str] = []

    async def on_dead(msg: Any) -> None:
        if (msg.headers or {}).get("x-megha-queue") == cfg.user_queue("u0"):
            reasons.append(str(msg.headers.get("x-megha-reason")))

    await listen_dead_letters(sub, cfg, on_dead)

    def job(name: str) -> Job:
        t = TaskSpec(task_id=TaskId(f"{name}.t0"), job_id=JobId(name), user=UserId("u0"),
                     demand=(1,), duration=0.05)  # fmt: skip
        return Job(JobId(name), UserId("u0"), 0.0, [t])

    await sub.submit(job(jid))
    deadline = time.time() + 90
    for _ in range(900):  # the GM dies, gunicorn starts another, which takes it again
        if reasons or time.time() > deadline:
            break
        await asyncio.sleep(0.2)
    await sub.submit(job(f"good-{jid}"))
    key = (UserId("u0"), TaskId(f"good-{jid}.t0"))
    for _ in range(900):
        if key in sub.outcomes.finished or time.time() > deadline:
            break
        await asyncio.sleep(0.1)
    await sub.close()
    return reasons, key in sub.outcomes.finished
