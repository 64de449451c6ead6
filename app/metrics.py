"""Prometheus metrics, one registry per app so several apps can live in one process."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
HEARTBEAT_PREFIX = "attribution:heartbeat:"
HEARTBEAT_EVERY_S = 10.0
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


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
            "Wall time of explain requests by model, explainer and HTTP status",
            ["model", "explainer", "status"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.model_evals = Counter(
            "model_evals_total",
            "Model evaluations (rows) spent by explainers",
            ["model", "explainer"],
            registry=self.registry,
        )
        self.cancelled = Counter(
            "explain_cancelled_total",
            "Explanations stopped before their answer, by reason: disconnect (the client left), "
            "deadline (abandoned at its time limit), shutdown",
            ["reason"],
            registry=self.registry,
        )
        self.cache = Counter(
            "explain_cache_requests_total",
            "Cache lookups by result (hit, miss, bypass)",
            ["result"],
            registry=self.registry,
        )
        self.cache_up = Gauge(
            "explain_cache_up",
            "1 when the cache backend answers",
            registry=self.registry,
            multiprocess_mode="mostrecent",  # several API processes: the latest reading
        )
        self.http_requests = Counter(
            "http_requests_total",
            "HTTP requests by method, route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.http_duration = Histogram(
            "http_request_duration_seconds",
            "Wall time of HTTP requests by method, route template and status",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )

    def watch_jobs(self, queue: Any, jobs: Any, redis_url: str | None) -> None:
        """Queue depth, unfinished jobs and worker heartbeats, read when /metrics is scraped."""
        self.jobs_collector = JobCollector(queue, jobs, redis_url)
        self.registry.register(self.jobs_collector)

    def exposition(self) -> bytes:
        """The text format of /metrics; with several API processes (PROMETHEUS_MULTIPROC_DIR,
        set by `python -m app`) the counters and histograms summed over all of them."""
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        collector = getattr(self, "jobs_collector", None)
        if collector is not None:
            registry.register(collector)
        return generate_latest(registry)


class JobCollector(Collector):
    """Reads the queue and the heartbeats at scrape time (no background polling)."""

    def __init__(self, queue: Any, jobs: Any, redis_url: str | None) -> None:
        self.queue = queue
        self.jobs = jobs
        self.redis_url = redis_url

    def _redis(self) -> Any:
        import redis

        url = str(self.redis_url)  # only called when a Redis URL is set
        return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        backend = getattr(self.queue, "backend", "unknown")
        depth = GaugeMetricFamily(
            "job_queue_depth", "Job chunks waiting for a worker", labels=["backend"]
        )
        value = self._depth(backend)
        if value is not None:
            depth.add_metric([backend], value)
        yield depth
        unfinished = GaugeMetricFamily(
            "jobs_unfinished", "Jobs queued or running", labels=["status"]
        )
        counts = {"queued": 0, "running": 0}
        try:
            for job in self.jobs.unfinished():
                counts[job.status] = counts.get(job.status, 0) + 1
        except Exception as exc:  # a scrape must not fail because the database hiccups
            log.warning("jobs_unfinished: %s", exc)
        for status, count in counts.items():
            unfinished.add_metric([status], count)
        yield unfinished
        yield from self._heartbeats(backend)

    def _depth(self, backend: str) -> float | None:
        try:
            if backend == "celery" and self.redis_url:
                return float(self._redis().llen("celery"))  # Celery's default queue (a list)
            pool = getattr(self.queue, "pool", None)
            work = getattr(pool, "_work_queue", None)  # ThreadPoolExecutor's pending items
            return float(work.qsize()) if work is not None else None
        except Exception as exc:
            log.warning("job_queue_depth: %s", exc)
            return None

    def _heartbeats(self, backend: str) -> Iterator[GaugeMetricFamily]:
        beats = GaugeMetricFamily(
            "worker_heartbeat_timestamp_seconds",
            "Unix time of each worker's last heartbeat",
            labels=["worker"],
        )
        alive = GaugeMetricFamily(
            "workers_alive", f"Workers with a heartbeat in the last {3 * HEARTBEAT_EVERY_S:.0f} s"
        )
        n_alive = 0
        if backend == "celery" and self.redis_url:
            try:
                client = self._redis()
                for key in client.scan_iter(f"{HEARTBEAT_PREFIX}*", count=100):
                    stamp = client.get(key)
                    if stamp is None:
                        continue
                    name = key.decode()[len(HEARTBEAT_PREFIX) :]
                    beats.add_metric([name], float(stamp))
                    n_alive += time.time() - float(stamp) < 3 * HEARTBEAT_EVERY_S
            except Exception as exc:
                log.warning("worker heartbeats: %s", exc)
        else:  # in-process: the job threads of this process are the workers
            pool = getattr(self.queue, "pool", None)
            n_alive = sum(t.is_alive() for t in getattr(pool, "_threads", ()))
        alive.add_metric([], n_alive)
        yield beats
        yield alive


class Heartbeat:
    """A worker process writes `attribution:heartbeat:<host>:<pid>` = unix time every 10 s
    (expiring after a minute), so the API's /metrics can tell live workers from dead ones."""

    def __init__(self, redis_url: str, name: str | None = None) -> None:
        import redis

        self.client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
        self.key = HEARTBEAT_PREFIX + (name or f"{socket.gethostname()}:{os.getpid()}")
        self.stop = threading.Event()

    def beat(self) -> None:
        self.client.set(self.key, repr(time.time()), ex=int(6 * HEARTBEAT_EVERY_S))

    def run(self, every_s: float = HEARTBEAT_EVERY_S) -> None:
        while not self.stop.is_set():
            try:
                self.beat()
            except Exception as exc:  # Redis down: keep trying, the worker itself goes on
                log.warning("heartbeat failed: %s", exc)
            self.stop.wait(every_s)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="heartbeat", daemon=True)
        thread.start()
        return thread
