"""A million-row audit of a TreeSHAP model on this machine: does it complete, and how much
memory do the server and its model workers take while it runs?

tree_audit_bench's XGBoost classifier (200 trees, depth 6, 30 DataFrame columns), the real
`python -m app` at its defaults (embedded queue, SQLite job store). The rows are written to a
Parquet file a block at a time and uploaded (POST /v2/jobs/upload, streamed from disk); the
bench polls the job, then downloads every result twice, as Parquet and as JSON lines, each
streamed to disk, and counts them. Memory: the proportional set size of the server process and
of each of its child processes (the model workers), sampled every --sample s from after the model's
registration (the baseline) to the end of the downloads; the peak of their sum over the
baseline is the figure (the issue's goal: within +1 GB). Values of --check rows are compared
with shap.TreeExplainer's.

Run:  .venv/bin/python bench/million_audit_bench.py [--rows 1000000] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.tree_audit_bench import (  # noqa: E402
    REL_TOL,
    UNFINISHED,
    make_rows,
    register,
    server_env,
    signed,
    start_server,
    train,
)

BLOCK = 100_000  # rows generated and written to Parquet at a time


class Memory(threading.Thread):
    """Samples the proportional set size (PSS: a page shared by n processes counts 1/n in
    each) of a process and its children, bytes, until stopped. The model workers fork from one
    zygote and share its pages: a sum of resident sets would count those pages once a worker."""

    def __init__(self, pid: int, every: float) -> None:
        super().__init__(daemon=True)
        import psutil

        self.proc = psutil.Process(pid)
        self.every = every
        self.done = threading.Event()
        self.peak_total = 0
        self.peak: dict[str, int] = {}  # "server" / "workers" -> peak rss
        self.baseline = self.sample()[0]

    def sample(self) -> tuple[int, int, int]:
        import psutil

        server = self.proc.memory_full_info().pss
        workers = 0
        for child in self.proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # exited between the listing and the read
                workers += child.memory_full_info().pss
        return server + workers, server, workers

    def run(self) -> None:
        while not self.done.wait(self.every):
            total, server, workers = self.sample()
            self.peak_total = max(self.peak_total, total)
            self.peak["server"] = max(self.peak.get("server", 0), server)
            self.peak["workers"] = max(self.peak.get("workers", 0), workers)


def write_parquet(path: Path, rows: int) -> None:
    """`rows` rows of tree_audit_bench's columns (make_rows, one seed per block)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    for start in range(0, rows, BLOCK):
        frame = make_rows(min(BLOCK, rows - start), 1000 + start // BLOCK)
        table = pa.Table.from_pandas(frame, preserve_index=False)
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()


def download(http: Any, job_id: str, fmt: str, path: Path) -> float:
    """Stream GET /v2/jobs/{id}/results?format=fmt to `path`; seconds."""
    start = time.perf_counter()
    with http.stream("GET", f"/v2/jobs/{job_id}/results", params={"format": fmt}) as r:
        r.raise_for_status()
        with path.open("wb") as f:
            for block in r.iter_bytes(1 << 20):
                f.write(block)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--check", type=int, default=20, help="rows compared with shap")
    parser.add_argument("--sample", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--poll", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=Path("/tmp/million_audit_bench.json"))
    args = parser.parse_args()
    import httpx
    import pyarrow.parquet as pq
    import shap

    tmp = Path(tempfile.mkdtemp(prefix="million-audit-bench-"))
    booster = train(tmp / "model.json")
    data = tmp / "rows.parquet"
    write_parquet(data, args.rows)
    env_args = argparse.Namespace(database_url=None, model_dir=None, redis=None)
    server = start_server(server_env(env_args, tmp), tmp, 0)
    report: dict[str, Any] = {"rows": args.rows, "loadavg_start": list(os.getloadavg())}
    try:
        name = f"million-{uuid.uuid4().hex[:6]}"
        register(server.url, name, tmp / "model.json")
        memory = Memory(server.proc.pid, args.sample)
        memory.start()
        with httpx.Client(base_url=server.url, timeout=3600) as http:
            t0 = time.perf_counter()
            job = {"kind": "audit", "model": name, "explainer": "shapley"}
            with data.open("rb") as f:
                r = http.post(
                    "/v2/jobs/upload",
                    data={"job": json.dumps(job)},
                    files={"file": ("rows.parquet", f, "application/vnd.apache.parquet")},
                )
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            uploaded = time.perf_counter() - t0
            while True:
                status = http.get(f"/v2/jobs/{job_id}").json()
                if status["status"] not in (*UNFINISHED, "receiving"):
                    break
                time.sleep(args.poll)
            computed = time.perf_counter() - t0
            parquet_s = download(http, job_id, "parquet", tmp / "results.parquet")
            jsonl_s = download(http, job_id, "jsonl", tmp / "results.jsonl")
        memory.done.set()
        memory.join()
        table = pq.ParquetFile(tmp / "results.parquet")
        lines = 0
        picks = set(np.random.default_rng(0).choice(args.rows, args.check, replace=False).tolist())
        answers: dict[int, tuple[int, list[float]]] = {}
        with (tmp / "results.jsonl").open("rb") as f:
            for line in f:
                if lines in picks:
                    e = json.loads(line)["explanation"]
                    answers[lines] = (int(e["output_index"]), list(e["values"]))
                lines += 1
        frame = pq.read_table(data).to_pandas()
        order = sorted(picks)
        reference = np.asarray(shap.TreeExplainer(booster).shap_values(frame.iloc[order]))
        worst = max(
            float(np.abs(np.asarray(answers[i][1]) - signed(reference[k], answers[i][0])).max())
            for k, i in enumerate(order)
        )
        scale = float(np.abs(reference).max())
        report.update(
            status=status["status"],
            progress=status["progress"],
            upload_s=uploaded,
            until_finished_s=computed,
            rows_per_s=args.rows / computed,
            download_parquet_s=parquet_s,
            download_jsonl_s=jsonl_s,
            parquet_rows=table.metadata.num_rows,
            parquet_mb=(tmp / "results.parquet").stat().st_size / 1e6,
            jsonl_lines=lines,
            jsonl_mb=(tmp / "results.jsonl").stat().st_size / 1e6,
            memory_baseline_mb=memory.baseline / 1e6,
            memory_peak_mb=memory.peak_total / 1e6,
            memory_peak_over_baseline_mb=(memory.peak_total - memory.baseline) / 1e6,
            peak_server_mb=memory.peak.get("server", 0) / 1e6,
            peak_workers_mb=memory.peak.get("workers", 0) / 1e6,
            values_max_abs_diff=worst,
            values_ok=worst <= REL_TOL * max(1.0, scale),
            job_db_mb=(tmp / "jobs.db").stat().st_size / 1e6,
            loadavg_end=list(os.getloadavg()),
        )
    finally:
        server.stop()
    for k, v in report.items():
        print(f"  {k:30s} {v}")
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
