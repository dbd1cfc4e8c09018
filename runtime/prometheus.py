"""Prometheus ``/metrics`` of a service: its core's typed counters, read at scrape time,
plus request and refusal counts kept by the driver."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.metrics import Counters

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class CoreCollector(Collector):
    """Exposes ``counters()`` as counters and ``gauges()`` as gauges, prefixed."""

    prefix: str
    counters: Callable[[], Counters | Mapping[str, float]]
    gauges: Callable[[], Mapping[str, float]]

    def collect(self) -> Iterator[Metric]:
        c = self.counters()
        items = c.as_dict() if isinstance(c, Counters) else c
        for k, v in items.items():
            yield CounterMetricFamily(f"{self.prefix}_{k}", f"{self.prefix} counter {k}", v)
        for k, g in self.gauges().items():
            yield GaugeMetricFamily(f"{self.prefix}_{k}", f"{self.prefix} {k}", g)


class ServiceMetrics:
    """One registry per service process."""

    def __init__(
        self,
        prefix: str,
        counters: Callable[[], Counters | Mapping[str, float]],
        gauges: Callable[[], Mapping[str, float]],
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(CoreCollector(prefix, counters, gauges))
        self.requests = Counter(
            f"{prefix}_requests", "requests handled", ["endpoint"], registry=self.registry
        )
        self.errors = Counter(
            f"{prefix}_refused", "inputs refused, by reason", ["reason"], registry=self.registry
        )

    def render(self) -> bytes:
        out: bytes = generate_latest(self.registry)
        return out
