"""A live run's report (``megha bench``): this run's counters from the services' state
pages, the traffic on each path, the jobs' completion times and fairness, and the files.

``summary.json`` holds summaries: each service's state page goes into it without its
raw series (``RAW_SERIES``: each GM's recent allocation times, each LM's free
resources per node), which go to files of their own under ``series/`` beside it.
"""

from __future__ import annotations

import csv
import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from common.config import FederationConfig
from common.dag import DagJob
from common.ids import JobId
from common.model import Task
from reporting.fairness import Span, jain_windows, usage_samples
from reporting.files import write_json
from reporting.plots import plot_cdfs, plot_components
from reporting.tally import Floats, jct_stats
from workload.jobs import Job, specs_of

COUNTERS_GM = ("internal_inconsistencies", "external_inconsistencies", "requeues", "failed")
COUNTERS_LM = (
    "preemptions",
    "repartitions",
    "refused_internal",
    "refused_external",
    "workers_lost",
)


def counters_from(states: dict[str, Any]) -> dict[str, int]:
    """The federation's counters, summed over the GMs' and LMs' state pages: since each
    service started (``counters_between``: a run's)."""
    total: dict[str, int] = dict.fromkeys((*COUNTERS_GM, *COUNTERS_LM, "dead_lettered"), 0)
    for name, st in states.items():
        for k, v in _counters_of(name, st).items():
            total[k] += v
    total["inconsistencies"] = total["internal_inconsistencies"] + total["external_inconsistencies"]
    return total


def _counters_of(name: str, page: dict[str, Any]) -> dict[str, int]:
    """One service's counters of ``counters_from``, from its state page."""
    c = page.get("counters", {})
    out = {k: int(c.get(k, 0)) for k in (COUNTERS_GM if name.startswith("gm") else COUNTERS_LM)}
    out["dead_lettered"] = int(page.get("dead_lettered", 0))
    return out


def _restarted(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """The service's process changed between two of its pages: a counter went down, or
    (an LM) another incarnation holds it, under a new epoch."""
    if before.get("epoch") != after.get("epoch"):
        return True
    was = before.get("counters", {})
    now = after.get("counters", {})
    return any(
        isinstance(v, int) and isinstance(was.get(k), int) and v < was[k] for k, v in now.items()
    ) or int(after.get("dead_lettered", 0)) < int(before.get("dead_lettered", 0))


def counters_between(
    before: dict[str, Any], after: dict[str, Any]
) -> tuple[dict[str, int], list[str]]:
    """This run's counters (``counters_from``'s, summed over the services): each
    service's at the end less at the start; and notes on the services for which that
    could not be: one restarted during the run (or did not answer at its start) counts
    from its start, one that did not answer at the end is left out."""
    total: dict[str, int] = dict.fromkeys((*COUNTERS_GM, *COUNTERS_LM, "dead_lettered"), 0)
    notes: list[str] = []
    for name, page in after.items():
        if name.endswith("-workers"):  # a pool counts none of these
            continue
        if "error" in page:
            notes.append(f"{name}: no answer at the end; not counted")
            continue
        now = _counters_of(name, page)
        then = before.get(name, {"error": "not asked"})
        if "error" in then:
            notes.append(f"{name}: no answer at the start; counted from its start")
            base = dict.fromkeys(now, 0)
        elif _restarted(then, page):
            notes.append(f"{name}: restarted during the run; counted since its restart")
            base = dict.fromkeys(now, 0)
        else:
            base = _counters_of(name, then)
        for k, v in now.items():
            total[k] += v - base[k]
    total["inconsistencies"] = total["internal_inconsistencies"] + total["external_inconsistencies"]
    return total, notes


def traffic_from(states: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Messages sent on each path of the federation and the items they carried, summed
    over the state pages (counted from each process's start)."""
    total: dict[str, dict[str, int]] = {}

    def add(path: str, messages: int, items: int) -> None:
        t = total.setdefault(path, {"messages": 0, "items": 0})
        t["messages"] += messages
        t["items"] += items

    for name, st in states.items():
        c = st.get("counters", {})
        if name.startswith("gm"):
            add("gm_to_lm_launches", int(c.get("launch_requests", 0)), int(c.get("decisions", 0)))
        role = "pool" if name.endswith("-workers") else "gm" if name.startswith("gm") else "lm"
        for what, b in st.get("batches", {}).items():
            add(f"{role}_{what}", int(b["messages"]), int(b["items"]))
    return total


def capacity(cfg: FederationConfig) -> list[int]:
    """The federation's capacity, summed over its nodes per resource."""
    return [
        sum(col) for col in zip(*(n.capacity for c in cfg.clusters for n in c.nodes), strict=True)
    ]


def job_metrics(
    cfg: FederationConfig, jobs: list[Job | DagJob], tasks: Sequence[Task]
) -> dict[str, Any]:
    """``job_metrics_of`` a list of tasks (every task of ``jobs``)."""
    by_key = {t.key: t for t in tasks}
    ends = array("d", [math.nan]) * len(jobs)
    for i, j in enumerate(jobs):
        e = [by_key[(s.user, s.task_id)].finished_at for s in specs_of(j)]
        if e and all(x >= 0 for x in e):
            ends[i] = max(e)
    spans = ((t.started_at, t.finished_at, t.user, t.demand) for t in tasks)
    return job_metrics_of(cfg, jobs, ends, spans)


def job_metrics_of(
    cfg: FederationConfig,
    jobs: Sequence[Job | DagJob],
    ends: Sequence[float],
    spans: Iterable[Span],
) -> dict[str, Any]:
    """Job completion times, makespan and Jain's index over 60-s windows: ``ends`` has
    each job's latest task end (NaN if some task did not end), ``spans`` the tasks'
    measured runs."""
    jct: dict[JobId, float] = {}
    by_user: dict[Any, list[tuple[float, float]]] = {}
    last = 0.0
    for j, end in zip(jobs, ends, strict=True):
        if not math.isnan(end):
            jct[j.job_id] = end - j.arrival
            last = max(last, end)
        by_user.setdefault(j.user, []).append((j.arrival, j.arrival + jct.get(j.job_id, 1e18)))
    first = min((j.arrival for j in jobs), default=0.0)
    samples = usage_samples(spans, capacity(cfg), first, last)
    shares = {u.user: u.share for u in cfg.user_configs}
    return {
        "jct_s": jct_stats(jct),
        "makespan_s": last - first if jct else 0.0,
        "jobs_completed": len(jct),
        "jain": jain_windows(samples, by_user, shares),
    }


def _role(name: str) -> str:
    """A service's role from its name: ``gm``, ``lm`` or ``pool`` (``lmJ-workers``)."""
    return "pool" if name.endswith("-workers") else "gm" if name.startswith("gm") else "lm"


RECENT_ALLOCATIONS = "series/recent_allocations.csv"
"""Each GM's recent allocation times (its ``/v1/state`` ``allocations.recent``: when
each task's end reached it, and the task's allocation time; the latest minute, at
most 4,096: the dashboard's histogram)."""
FREE_BY_NODE = "series/free_by_node.csv"
"""Each LM's free resources per node at the end of the run (its ``/v1/state`` ``free``)."""
RAW_SERIES: dict[str, tuple[tuple[str, ...], str]] = {
    "gm": (("allocations", "recent"), RECENT_ALLOCATIONS),
    "lm": (("free",), FREE_BY_NODE),
}
"""Per role, where a state page holds a raw series and the file it goes to."""


def _without(page: Mapping[str, Any], path: tuple[str, ...], note: Any) -> dict[str, Any]:
    """A copy of ``page`` with the value at ``path`` replaced by ``note``."""
    out = dict(page)
    if len(path) == 1:
        out[path[0]] = note
    else:
        out[path[0]] = _without(page[path[0]], path[1:], note)
    return out


def _at(page: Mapping[str, Any], path: tuple[str, ...]) -> list[Any] | None:
    """The list at ``path`` in ``page`` (None if the page has none there)."""
    value: Any = page
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, list) else None


def service_pages(states: Mapping[str, Any]) -> dict[str, Any]:
    """The services' state pages as ``summary.json`` holds them: each raw series
    (``RAW_SERIES``) replaced by the file it went to and its number of rows."""
    pages: dict[str, Any] = {}
    for name, page in states.items():
        where = RAW_SERIES.get(_role(name))
        values = _at(page, where[0]) if where is not None else None
        if where is None or values is None:
            pages[name] = page
            continue
        pages[name] = _without(page, where[0], {"file": where[1], "rows": len(values)})
    return pages


def series_rows(states: Mapping[str, Any]) -> dict[str, list[list[Any]]]:
    """Each raw-series file's rows (after its header): the service's name, then the
    task's end (as its GM learnt it) and allocation time, or the node and its free resources."""
    rows: dict[str, list[list[Any]]] = {RECENT_ALLOCATIONS: [], FREE_BY_NODE: []}
    for name, page in states.items():
        where = RAW_SERIES.get(_role(name))
        values = _at(page, where[0]) if where is not None else None
        if where is None or values is None:
            continue
        if where[1] == RECENT_ALLOCATIONS:
            rows[RECENT_ALLOCATIONS] += [[name, at, a] for at, a in values]
        else:
            rows[FREE_BY_NODE] += [[name, node, *free] for node, free in enumerate(values)]
    return rows


def write_series(out: Path, states: Mapping[str, Any]) -> None:
    """The raw series of the services' pages, one CSV each under ``out/series/``."""
    rows = series_rows(states)
    width = max((len(r) - 2 for r in rows[FREE_BY_NODE]), default=1)
    headers = {
        RECENT_ALLOCATIONS: ["gm", "finished_at", "allocation_s"],
        FREE_BY_NODE: ["lm", "node", *(f"free_{r}" for r in range(width))],
    }
    for file, header in headers.items():
        path = out / file
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(header)
            writer.writerows(rows[file])


def write_outputs(
    out: Path,
    summary: dict[str, Any],
    allocation: Sequence[float] | Floats,
    states: Mapping[str, Any],
) -> None:
    """``summary.json``, the services' raw series (``write_series``) and the plots
    (``tasks.csv`` was written as the tasks ended); ``allocation``: every started
    task's allocation time; ``states``: the services' state pages at the end."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "summary.json", summary)
    write_series(out, states)
    plot_cdfs(
        out / "allocation_cdf.png", {"allocation time": allocation},
        "Allocation time (live federation)",
    )  # fmt: skip
    plot_components(
        out / "components.png", {"live": summary["components_s"]}, "Allocation-time components"
    )
