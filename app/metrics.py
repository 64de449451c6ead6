"""Prometheus metrics, one registry per app so several apps can live in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "explain_requests_total",
            "Explain requests by model, explainer and HTTP status",
            ["model", "explainer", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "explain_request_duration_seconds",
            "Wall time of explain requests",
            ["model", "explainer"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.model_evals = Counter(
            "model_evals_total",
            "Model evaluations (rows) spent by explainers",
            ["model", "explainer"],
            registry=self.registry,
        )
        self.cache = Counter(
            "explain_cache_requests_total",
            "Cache lookups by result (hit, miss, bypass)",
            ["result"],
            registry=self.registry,
        )
        self.cache_up = Gauge(
            "explain_cache_up", "1 when the cache backend answers", registry=self.registry
        )
