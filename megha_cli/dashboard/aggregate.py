"""What the dashboard shows, from the services' ``/v1/state`` pages sampled over time.

Pure: the caller gives every sample its time; nothing here reads a clock or waits.

Rates are differences of counters over the last minute (a counter that falls belongs
to a new incarnation of its process and counts on from where the old one stopped).

Allocation times are exact: every GM's page lists the allocation time (submission to
the start that ran to completion) of each task it saw finish in the last minute (its
latest 4,096); the histogram, p50 and p99 are over the union of those lists.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from common.config import FederationConfig
from common.metrics import percentiles

WINDOW_S = 60.0
"""Rates and the allocation histogram are over the last minute."""
KEEP_S = 600.0
"""How far back a curve is kept (a task that waited longer shows as waiting this long)."""
EDGES_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Upper edges of the allocation-time histogram's bins (one more bin above the last)."""


class Curve:
    """A cumulative count sampled over time, never decreasing.

    ``restarts``: a fall means the counting process began anew from zero (its count
    goes on from the last value); otherwise a fall is held at the last value."""

    def __init__(self, *, restarts: bool = True, keep_s: float = KEEP_S) -> None:
        self.restarts = restarts
        self.keep_s = keep_s
        self.times: list[float] = []
        self.values: list[float] = []
        self._base = 0.0
        self._raw: float | None = None

    def add(self, t: float, raw: float) -> float:
        """Record ``raw`` at time ``t``; returns the continued value."""
        if self.restarts:
            if self._raw is not None and raw < self._raw:
                self._base += self._raw
            self._raw = raw
            value = self._base + raw
        else:
            value = max(raw, self.values[-1]) if self.values else raw
        if self.times and t <= self.times[-1]:
            self.values[-1] = max(self.values[-1], value)
            return self.values[-1]
        self.times.append(t)
        self.values.append(value)
        cut = bisect.bisect_left(self.times, t - self.keep_s) - 1
        if cut > 0:
            del self.times[:cut]
            del self.values[:cut]
        return value

    def at(self, t: float) -> float:
        """The count at time ``t`` (linear between samples, held outside them)."""
        if not self.times:
            return 0.0
        i = bisect.bisect_right(self.times, t)
        if i == 0:
            return self.values[0]
        if i == len(self.times):
            return self.values[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        v0, v1 = self.values[i - 1], self.values[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def when(self, n: float) -> float | None:
        """When the count reached ``n`` (the first sample's time if it had already);
        None if it has not yet."""
        i = bisect.bisect_left(self.values, n)
        if i == len(self.values):
            return None
        if i == 0:
            return self.times[0]
        t0, t1 = self.times[i - 1], self.times[i]
        v0, v1 = self.values[i - 1], self.values[i]
        return t0 + (t1 - t0) * (n - v0) / (v1 - v0)

    def per_minute(self, now: float, window_s: float = WINDOW_S) -> float:
        """The count's increase over the last ``window_s`` (or since the first sample,
        if that is later), per minute."""
        if not self.times:
            return 0.0
        span = min(window_s, now - self.times[0])
        if span <= 0:
            return 0.0
        return (self.at(now) - self.at(now - span)) * 60.0 / span


def histogram(values: Iterable[float], edges: Sequence[float] = EDGES_S) -> list[int]:
    """Counts per bin: bin i holds values in [edges[i-1], edges[i]); the last bin holds
    those from ``edges[-1]`` up."""
    counts = [0] * (len(edges) + 1)
    for v in values:
        counts[bisect.bisect_right(edges, v)] += 1
    return counts


def allocation_summary(
    pages: Iterable[Mapping[str, Any]], now: float, window_s: float = WINDOW_S
) -> dict[str, Any]:
    """Histogram, p50 and p99 of the allocation times of the tasks that finished in the
    last ``window_s``, from the GMs' pages (``allocations.recent``: [finished at,
    allocation s]).  A page lists what its GM kept; ``tasks`` counts them."""
    times = [
        float(a)
        for page in pages
        for at, a in page.get("allocations", {}).get("recent", ())
        if now - window_s < float(at) and float(a) >= 0
    ]
    p = percentiles(times)
    return {
        "window_s": window_s,
        "tasks": len(times),
        "p50_s": p["p50"],
        "p99_s": p["p99"],
        "mean_s": p["mean"],
        "edges_s": list(EDGES_S),
        "counts": histogram(times),
    }


# ------------------------------------------------------------------ the board
def gm_departures(page: Mapping[str, Any]) -> float:
    """A GM's tasks that have left the wait (running, ended, or put back in a queue by
    a preemption or a lost LM, where they wait again as new arrivals)."""
    c = page["counters"]
    return float(
        page["running_tasks"]
        + c["tasks_finished"]
        + c["failed"]
        + c["preempted_requeued"]
        + c["lost_with_lm"]
    )


def metric_totals(text: str) -> dict[str, float]:
    """From a service's ``/metrics``: the messages it took over HTTP and the inputs it
    refused (bad signature, stale epoch, malformed body, ...), summed over labels."""
    out = {"http_requests": 0.0, "http_refused": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_requests_total"):
                out["http_requests"] += sample.value
            elif sample.name.endswith("_refused_total"):
                out["http_refused"] += sample.value
    return out


RATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "preemptions": ("lm", ("preemptions",)),
    "inconsistencies": ("gm", ("internal_inconsistencies", "external_inconsistencies")),
    "repartitions": ("lm", ("repartitions",)),
    "tasks_finished": ("gm", ("tasks_finished",)),
    "http_requests": ("process", ("http_requests",)),
    "http_refused": ("process", ("http_refused",)),
}
"""Per-minute rates: which services' counters (summed) each is made of (``process``:
every GM and LM process, from its ``/metrics``)."""


@dataclass(frozen=True)
class Layout:
    """What the config says of the federation: its services, partitions and users."""

    name: str
    gms: tuple[str, ...]
    lms: tuple[str, ...]
    processes: Mapping[str, tuple[str, ...]]
    """Per LM, its processes (the LM, and its standby if it has one)."""
    homes: Mapping[str, tuple[str, ...]]
    """Per LM, the GM whose partition each node is in."""
    users: tuple[tuple[str, str, float], ...]
    """(user, its GM, its configured share of the federation)."""

    @classmethod
    def of(cls, cfg: FederationConfig) -> Layout:
        lms = tuple(cfg.lm_ids)
        return cls(
            name=cfg.name,
            gms=tuple(cfg.gm_ids),
            lms=lms,
            processes={lm: (lm, f"{lm}-standby") if cfg.lm_standby else (lm,) for lm in lms},
            homes={lm: tuple(c.home) for lm, c in zip(lms, cfg.clusters, strict=True)},
            users=tuple((u.user, u.gm, u.share) for u in cfg.user_configs),
        )

    @property
    def polled(self) -> list[str]:
        """Every process the dashboard polls."""
        return [*self.gms, *(p for lm in self.lms for p in self.processes[lm])]


def bits(flags: Iterable[bool]) -> str:
    return "".join("1" if f else "0" for f in flags)


class Board:
    """The federation as the dashboard last saw it, and its recent history."""

    def __init__(self, layout: Layout, max_events: int = 50) -> None:
        self.layout = layout
        self.pages: dict[str, Mapping[str, Any]] = {}
        """Each process's last page (kept while it is down, shown as stale)."""
        self.up: dict[str, bool] = {}
        self.errors: dict[str, str] = {}
        self.seen_at: dict[str, float] = {}
        self.broker_up: bool | None = None
        self.curves: dict[tuple[str, str], Curve] = {}
        self.departures: dict[str, Curve] = {g: Curve() for g in layout.gms}
        """Per GM: tasks that left the wait (placed), for the placements per minute."""
        self.events: deque[dict[str, Any]] = deque(maxlen=max_events)
        self._lm_seen: dict[str, tuple[int, float]] = {}

    def _event(self, now: float, who: str, what: str) -> None:
        self.events.appendleft({"at": now, "who": who, "what": what})

    def _curve(self, service: str, counter: str) -> Curve:
        c = self.curves.get((service, counter))
        if c is None:
            c = self.curves[(service, counter)] = Curve()
        return c

    # ---------------------------------------------------------------- inputs
    def observe(
        self, now: float, process: str, page: Mapping[str, Any] | None, error: str = ""
    ) -> None:
        """One poll of ``process``: its page, or why there was none."""
        was = self.up.get(process)
        up = page is not None
        self.up[process] = up
        self.errors[process] = "" if up else (error or "no answer")
        if was is not None and was != up:
            self._event(now, process, "up again" if up else f"down ({self.errors[process]})")
        elif was is None and not up:
            self._event(now, process, f"down ({self.errors[process]})")
        if page is None:
            return
        self.pages[process] = page
        self.seen_at[process] = now
        if process in self.layout.gms:
            self._observe_gm(now, process, page)
        elif page.get("active", True) and "lm" in page:
            self._observe_lm(now, str(page["lm"]), page)

    def _observe_gm(self, now: float, gm: str, page: Mapping[str, Any]) -> None:
        self.departures[gm].add(now, gm_departures(page))
        for counter, value in page["counters"].items():
            self._curve(gm, counter).add(now, float(value))

    def _observe_lm(self, now: float, lm: str, page: Mapping[str, Any]) -> None:
        counters = page["counters"]
        for counter, value in counters.items():
            self._curve(lm, counter).add(now, float(value))
        epoch, reparts = int(page["epoch"]), float(counters["repartitions"])
        seen = self._lm_seen.get(lm)
        self._lm_seen[lm] = (epoch, reparts)
        if seen is None:
            return
        if epoch != seen[0]:
            self._event(now, lm, f"new incarnation, epoch {epoch}")
        elif reparts > seen[1]:
            self._event(
                now,
                lm,
                f"+{reparts - seen[1]:.0f} repartitions (logical nodes now "
                f"{page['logical_nodes']})",
            )

    def observe_metrics(self, now: float, process: str, text: str) -> None:
        """A scrape of ``process``'s ``/metrics`` (a malformed one is ignored)."""
        try:
            totals = metric_totals(text)
        except ValueError:
            return
        for counter, value in totals.items():
            self._curve(process, counter).add(now, value)

    def observe_broker(self, now: float, up: bool) -> None:
        if self.broker_up is not None and up != self.broker_up:
            self._event(now, "broker", "up again" if up else "down (no TCP connection)")
        elif self.broker_up is None and not up:
            self._event(now, "broker", "down (no TCP connection)")
        self.broker_up = up

    # --------------------------------------------------------------- outputs
    def rate(self, name: str, now: float) -> float:
        role, counters = RATES[name]
        services = {"gm": self.layout.gms, "lm": self.layout.lms}.get(role, self.layout.polled)
        return sum(
            self.curves[(s, c)].per_minute(now)
            for s in services
            for c in counters
            if (s, c) in self.curves
        )

    def _gm_row(self, gm: str, now: float) -> dict[str, Any]:
        page = self.pages.get(gm, {})
        return {
            "id": gm,
            "up": self.up.get(gm, False),
            "ready": bool(page.get("ready", False)),
            "queued": page.get("queued"),
            "inflight": page.get("inflight"),
            "running": page.get("running_tasks"),
            "error": self.errors.get(gm, "not polled yet"),
            "age_s": now - self.seen_at[gm] if gm in self.seen_at else None,
        }

    def _lm_row(self, lm: str, now: float) -> dict[str, Any]:
        procs = self.layout.processes[lm]
        answering = [p for p in procs if self.up.get(p)]
        active = next((p for p in answering if self.pages[p].get("active", True)), None)
        shown = active or max(
            (p for p in procs if p in self.pages), key=lambda p: self.seen_at[p], default=None
        )
        page = self.pages.get(shown, {}) if shown else {}
        homes = self.layout.homes[lm]
        free = page.get("free", [])
        avail = [all(x > 0 for x in f) for f in free] if free else [False] * len(homes)
        return {
            "id": lm,
            "up": bool(answering),
            "active": active,
            "processes": [
                {
                    "name": p,
                    "up": self.up.get(p, False),
                    "role": (
                        "down"
                        if not self.up.get(p)
                        else "active"
                        if self.pages[p].get("active", True)
                        else "standby"
                    ),
                    "error": self.errors.get(p, "not polled yet"),
                }
                for p in procs
            ],
            "stale": active is None,
            "epoch": page.get("epoch"),
            "nodes": len(homes),
            "nodes_alive": page.get("nodes_alive"),
            "running": page.get("running_tasks"),
            "logical_nodes": page.get("logical_nodes"),
            "avail": bits(avail),
            "partitions": {g: bits(h == g for h in homes) for g in self.layout.gms},
            "age_s": now - self.seen_at[shown] if shown in self.seen_at else None,
        }

    def _user_row(self, user: str, gm: str, share: float) -> dict[str, Any]:
        page = self.pages.get(gm, {}) if self.up.get(gm) else {}
        return {
            "user": user,
            "gm": gm,
            "queue": page.get("queues", {}).get(user),
            "dominant_share": page.get("shares", {}).get(user, 0.0) if page else None,
            "share": share,
        }

    def snapshot(self, now: float) -> dict[str, Any]:
        """Everything the page shows, as JSON-able data."""
        lay = self.layout
        gms = [self._gm_row(g, now) for g in lay.gms]
        lms = [self._lm_row(lm, now) for lm in lay.lms]
        rates = {name: self.rate(name, now) for name in RATES}
        rates["allocations"] = sum(d.per_minute(now) for d in self.departures.values())
        return {
            "federation": lay.name,
            "at": now,
            "broker": {"up": self.broker_up},
            "counts": {
                "gms": len(gms),
                "gms_up": sum(1 for g in gms if g["up"]),
                "lms": len(lms),
                "lms_up": sum(1 for x in lms if x["up"]),
            },
            "gms": gms,
            "lms": lms,
            "users": [self._user_row(u, g, s) for u, g, s in lay.users],
            "rates_per_min": rates,
            "allocation": allocation_summary(
                (self.pages[g] for g in lay.gms if self.up.get(g) and g in self.pages), now
            ),
            "events": list(self.events),
        }
