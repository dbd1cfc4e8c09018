"""examples/wordcount end to end: generated files, map and reduce stages as sandboxed
commands on a federation started by ``megha up``, submitted with ``megha submit --wait``;
the reduces' output is the word count of the inputs, each task exited 0, and a reduce's
stdout is there to read with ``megha logs``."""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.config import FederationConfig

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wordcount"


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """Under /srv: a path every task uid may traverse (not /tmp, each task's own)."""
    root = Path(tempfile.mkdtemp(prefix="megha-wc-", dir="/srv"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def fed(make_federation: Callable[..., Federation], shared: Path) -> Federation:
    return make_federation(
        gms=1, lms=2, nodes_per_lm=3, heartbeat_s=0.5, task_commands=True,
        sandbox={"allow": ["/usr/bin/python3"], "shared_dir": str(shared), "timeout_s": 60.0},
        task_env_allow=["WC_*", "LANG"],
    )  # fmt: skip


def megha(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "megha_cli.main", *args, "--state-dir", str(home)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_wordcount_runs_with_megha_submit_wait(fed: Federation, shared: Path) -> None:
    cfg, home = fed
    user = cfg.user_configs[0].user
    root = shared / "wc"
    gen = subprocess.run(
        [sys.executable, str(EXAMPLE / "gen.py"), str(root), "--files", "4", "--reducers", "2"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    jobfile = shared / "wc.json"
    jobfile.write_text(gen.stdout)
    run = megha(home, "submit", str(jobfile), "--user", user, "--wait", "--id", "wc-1")
    why = megha(home, "job", "wc-1", "--user", user).stdout
    assert run.returncode == 0, run.stdout + run.stderr + why
    got: collections.Counter[str] = collections.Counter()
    for r in range(2):
        got.update(json.loads((root / "out" / f"part-{r}.json").read_text()))
    assert got == collections.Counter(json.loads((root / "expected.json").read_text()))
    job = json.loads(megha(home, "job", "wc-1", "--user", user, "--json").stdout)
    assert [t["exit_code"] for t in job["task_list"]] == [0] * 6
    logs = megha(home, "logs", "wc-1.s1.t0", "--user", user)
    assert logs.returncode == 0
    top = logs.stdout.splitlines()[0].split("\t")
    assert int(top[1]) == json.loads((root / "out" / "part-0.json").read_text())[top[0]]
    maps = megha(home, "logs", "wc-1.s0.t0", "--user", user)
    assert maps.stdout.startswith("map 0: 20000 words")


def test_a_task_is_given_the_variables_the_operator_allows(fed: Federation, tmp_path: Path) -> None:
    """``env`` in a job file reaches the sandboxed command for the names in
    ``task_env_allow``; a job naming another is refused at submission, in one line,
    exit 2, and nothing of it is submitted."""
    cfg, home = fed
    user = cfg.user_configs[0].user
    show = "import os; print(os.environ['WC_GREETING'], os.environ['LANG'], 'LD_PRELOAD' in os.environ)"
    env = {"WC_GREETING": "hello there", "LANG": "C"}
    job = {"format": "megha-job/1", "name": "env", "count": 1, "demand": [1], "duration": 30,
           "command": ["/usr/bin/python3", "-c", show],
           "env": env}  # fmt: skip
    jf = tmp_path / "env.json"
    jf.write_text(json.dumps(job))
    run = megha(home, "submit", str(jf), "--user", user, "--wait", "--id", "env-1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert megha(home, "logs", "env-1.s0.t0", "--user", user).stdout == "hello there C False\n"
    before = megha(home, "jobs", "--user", user, "--json").stdout
    jf.write_text(json.dumps({**job, "env": {**env, "LD_PRELOAD": "/x.so"}}))
    bad = megha(home, "submit", str(jf), "--user", user, "--id", "env-2")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert "env_not_allowed" in bad.stderr
    assert "LD_PRELOAD" in bad.stderr
    assert megha(home, "jobs", "--user", user, "--json").stdout == before
