"""End to end: a batch audit of a DataFrame-trained XGBoost classifier against shap's
TreeExplainer in process and the synchronous explain route, in one run, with ratios.

The model: XGBClassifier(n_estimators=200, max_depth=6, random_state=0), binary:logistic,
fitted on a DataFrame of 30 float columns f0..f29 (numpy default_rng(0); the label a
nonlinear function of a few columns plus noise), saved with get_booster().save_model(.json)
and registered with the real service (`python -m app` as a subprocess on a free port, its job
database and model folders in a temporary directory, built-in models not loaded: the bench
uses only its own model). For each size N in --rows, N explicand rows from the same
distribution (another seed per size), then:

  (a) shap in process: shap.TreeExplainer(booster) built once and .shap_values(frame) over
      the N rows (path-dependent, in log-odds: what the service's default TreeSHAP answers);
      the time includes building the explainer;
  (b) the synchronous route POST /v2/models/{name}/explain/shapley, 1,000 rows a request,
      sequential, with Cache-Control: no-cache (it runs after the audit on the same rows, and
      must neither reuse the audit's answers nor leave its own for anyone);
  (c) the audit through xai.Client, as Client.audit sends it (the same body, from the
      DataFrame): submit, poll GET /v2/jobs/{id} every --poll s recording (time, done), then
      download every result. Wall clock from building the body to the last result line.

From the progress samples: the rows/s of the first quarter of rows (from the submit's answer)
and of the last quarter, and their ratio (last/first; ~1 when the cost per row is constant).
Checks: the audit's values (and the sync route's) for 20 sampled rows against shap's, signed
by the output each explanation says it explained (binary: output 1 is the positive class's
log-odds, output 0 minus it), within 1e-4 of the values' scale (float32); which output the
audit explained; rows without values (errors) and cache hits.

Server settings stay at their defaults (2 cores: one API process, its job and explain
threads). The client uploads an audit whose JSON would pass 8 MiB as JSON lines (POST
/v2/jobs/upload), as it does for any user.
With --redis URL the server gets REDIS_URL (its defaults then: WEB_CONCURRENCY = cores, jobs
on Celery) and the bench starts --workers `python -m worker` processes.

Run:  .venv/bin/python bench/tree_audit_bench.py [--rows 5000,50000] [--chunk-size 50]
      [--redis redis://127.0.0.1:6379/0] [--database-url URL] [--timeout 3600] [--poll 0.5]
      [--out /tmp/tree_audit_bench.json] [--keep-server-log]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

N_FEATURES = 30
N_TRAIN = 20_000
SYNC_BATCH = 1_000  # rows per synchronous request (the default MAX_INSTANCES)
CHECK_ROWS = 20
READY_S = 900  # the built-ins train at start in a fresh MODEL_DIR
REL_TOL = 1e-4  # float32 values: differences relative to the values' scale
UNFINISHED = ("queued", "running")  # any other status is final (succeeded_with_errors, ...)
# Settings the server would inherit from this shell and that change what is measured; the
# bench sets its own (database, model folders, Redis) and leaves the rest at their defaults.
INHERITED = (
    "REDIS_URL", "DATABASE_URL", "MODEL_DIR", "USER_MODEL_DIR", "WEB_CONCURRENCY",
    "EXPLAIN_WORKERS", "TORCH_THREADS", "JOB_QUEUE", "JOB_WORKERS", "JOB_CHUNK_SIZE",
    "API_KEYS", "RATE_LIMIT", "MAX_BODY_BYTES", "MAX_INSTANCES", "MAX_JOB_INSTANCES",
    "LOAD_MODELS_ON_START", "LOAD_BACKGROUND_MODELS", "CACHE_SCOPE", "DEVICE",
    "PROMETHEUS_MULTIPROC_DIR", "ATTRIBUTION_READY_DIR", "ATTRIBUTION_PROCESSES",
)  # fmt: skip


# ---------------------------------------------------------------------------------- data


def features() -> list[str]:
    return [f"f{i}" for i in range(N_FEATURES)]


def make_rows(n: int, seed: int) -> Any:
    """n rows of the 30 float columns (a DataFrame), from default_rng(seed)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, N_FEATURES))
    x[:, 10:20] = rng.uniform(-2.0, 2.0, size=(n, 10))  # some bounded columns
    return pd.DataFrame(x, columns=features())


def make_label(frame: Any, rng: np.random.Generator) -> np.ndarray:
    """A nonlinear function of a few columns plus noise, thresholded at its median."""
    x = frame.to_numpy()
    score = (
        np.sin(2 * x[:, 0])
        + x[:, 1] * x[:, 2]
        + np.where(x[:, 3] > 0, x[:, 4], -0.5 * x[:, 5])
        + 0.5 * x[:, 10] ** 2
        - np.abs(x[:, 11])
        + 0.3 * x[:, 6]
        + 0.5 * rng.normal(size=len(x))
    )
    return (score > np.median(score)).astype(int)


def train(path: Path) -> Any:
    """Fit the classifier on a DataFrame, save its booster as JSON; the booster."""
    import xgboost as xgb

    frame = make_rows(N_TRAIN, 0)
    y = make_label(frame, np.random.default_rng(0))
    clf = xgb.XGBClassifier(n_estimators=200, max_depth=6, random_state=0)
    clf.fit(frame, y)
    booster = clf.get_booster()
    booster.save_model(str(path))
    return booster


# ---------------------------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(args: argparse.Namespace, tmp: Path) -> dict[str, str]:
    """The server's environment: ours, less the settings above, plus the bench's own."""
    env = {k: v for k, v in os.environ.items() if k not in INHERITED}
    env.update(
        DATABASE_URL=args.database_url or f"sqlite:///{tmp / 'jobs.db'}",
        MODEL_DIR=str(args.model_dir or tmp / "models"),
        USER_MODEL_DIR=str(tmp / "user-models"),
        # The built-ins load (train, in a fresh MODEL_DIR) before the server says ready, so
        # nothing trains during the timings; readiness needs them (LOAD_MODELS_ON_START=false
        # leaves /v2/health/ready at 503). The language models would load in the background,
        # converting for minutes while the bench runs: not loaded (the bench does not use them).
        LOAD_BACKGROUND_MODELS="false",
        PYTHONUNBUFFERED="1",
    )
    if args.redis:
        env["REDIS_URL"] = args.redis
    return env


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]]
    url: str
    log: Path

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        for p in [*self.workers, self.proc]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [*self.workers, self.proc]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start_server(env: dict[str, str], tmp: Path, n_workers: int) -> Server:
    import httpx

    port = free_port()
    log = tmp / "server.log"
    out = log.open("ab")
    cmd = [sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    workers = []
    if env.get("REDIS_URL"):
        for _ in range(n_workers):
            cmd = [sys.executable, "-m", "worker", "--log-level", "warning"]
            workers.append(
                subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            )
    server = Server(proc, workers, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + READY_S
    with httpx.Client(base_url=server.url, timeout=10) as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited ({proc.returncode}):\n{server.tail()}")
            try:
                if http.get("/v2/health/ready").status_code == 200:
                    return server
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"the server was not ready in {READY_S} s:\n{server.tail()}")
            time.sleep(0.2)


def register(url: str, name: str, path: Path) -> dict[str, Any]:
    import httpx

    with httpx.Client(base_url=url, timeout=600) as http:
        r = http.post(
            "/v2/repository/models",
            data={"name": name},
            files={"file": (path.name, path.read_bytes(), "application/json")},
        )
    if r.status_code >= 300:
        raise RuntimeError(f"registration answered {r.status_code}: {r.text[:500]}")
    return dict(r.json())


# ---------------------------------------------------------------------------------- figures


def crossing(samples: Sequence[tuple[float, int]], k: float) -> float | None:
    """When `done` reached k, linearly between the samples around it; None if never."""
    prev_t, prev_d = 0.0, 0
    for t, d in samples:
        if d >= k:
            if d == prev_d:
                return t
            return prev_t + (t - prev_t) * (k - prev_d) / (d - prev_d)
        prev_t, prev_d = t, d
    return None


@dataclass
class QuarterRates:
    first: float | None  # rows/s over rows [0, N/4), from the submit's answer
    last: float | None  # rows/s over rows [3N/4, N)
    ratio: float | None  # last / first
    note: str = ""


def quarter_rates(samples: Sequence[tuple[float, int]], total: int, poll: float) -> QuarterRates:
    """Rates of the first and last quarter of rows from (seconds since submit, done) samples.

    A quarter that took under two polling intervals is not resolved by the samples: its rate
    is left out (None) rather than reported from one step."""
    if total < 4 or not samples:
        return QuarterRates(None, None, None, "too few rows or samples")
    q = total / 4
    t1, t3, t4 = crossing(samples, q), crossing(samples, 3 * q), crossing(samples, total)
    first = last = None
    notes = []
    if t1 is not None and t1 >= 2 * poll:
        first = q / t1
    else:
        notes.append("first quarter faster than the polling")
    if t3 is not None and t4 is not None and t4 - t3 >= 2 * poll:
        last = (total - 3 * q) / (t4 - t3)
    else:
        notes.append(
            "last quarter unresolved" if t4 is None else "last quarter faster than the polling"
        )
    ratio = last / first if first and last else None
    return QuarterRates(first, last, ratio, "; ".join(notes))


def signed(values: np.ndarray, output_index: int) -> np.ndarray:
    """shap's positive-class log-odds values as output `output_index` of a binary model
    reports them (output 0: class 0's log-odds, minus class 1's)."""
    return values if output_index == 1 else -values


@dataclass
class Check:
    rows: int
    max_abs_diff: float | None
    scale: float
    ok: bool
    output_indices: list[int] = field(default_factory=list)


def check_values(
    reference: np.ndarray, answers: dict[int, tuple[int, list[float]]], picks: np.ndarray
) -> Check:
    """Compare each picked row's (output_index, values) with shap's row, signed by its output."""
    scale = float(np.abs(reference[picks]).max()) if len(picks) else 0.0
    diffs, outputs = [], []
    for i in picks:
        if int(i) not in answers:
            continue
        out, values = answers[int(i)]
        outputs.append(out)
        diffs.append(float(np.abs(np.asarray(values) - signed(reference[i], out)).max()))
    worst = max(diffs) if diffs else None
    ok = worst is not None and len(diffs) == len(picks) and worst <= REL_TOL * max(1.0, scale)
    return Check(len(diffs), worst, scale, ok, sorted(set(outputs)))


# ---------------------------------------------------------------------------------- runs


def run_shap(booster: Any, frame: Any) -> tuple[float, np.ndarray]:
    import shap

    start = time.perf_counter()
    explainer = shap.TreeExplainer(booster)
    values = np.asarray(explainer.shap_values(frame))
    took = time.perf_counter() - start
    return took, values.reshape(len(frame), N_FEATURES)


def run_sync(
    url: str, name: str, rows: np.ndarray, picks: set[int]
) -> tuple[float, dict[int, tuple[int, list[float]]], int]:
    """Every row through the synchronous route, SYNC_BATCH rows a request, one at a time."""
    import httpx

    answers: dict[int, tuple[int, list[float]]] = {}
    explained = 0
    headers = {"Cache-Control": "no-cache"}
    with httpx.Client(base_url=url, timeout=600) as http:
        start = time.perf_counter()
        for lo in range(0, len(rows), SYNC_BATCH):
            batch = rows[lo : lo + SYNC_BATCH].tolist()
            r = http.post(
                f"/v2/models/{name}/explain/shapley", json={"inputs": batch}, headers=headers
            )
            if r.status_code != 200:
                raise RuntimeError(f"sync route answered {r.status_code}: {r.text[:300]}")
            out = r.json()["data"]["explanations"]
            explained += len(out)
            for j, e in enumerate(out):
                if lo + j in picks:
                    answers[lo + j] = (int(e["output_index"]), list(e["values"]))
        took = time.perf_counter() - start
    return took, answers, explained


@dataclass
class AuditRun:
    seconds: float
    submit_s: float  # building the body and POST /v2/jobs
    download_s: float
    status: str
    samples: list[tuple[float, int]]
    results: int
    missing: int  # rows without values: an error result, or no result line at all
    errors: dict[str, int]
    output_indices: dict[int, int]  # output_index -> rows
    output_names: list[str]
    cache_hits: int | None
    answers: dict[int, tuple[int, list[float]]]
    job_id: str
    timed_out: bool


def run_audit(
    url: str,
    name: str,
    frame: Any,
    picks: set[int],
    chunk_size: int | None,
    poll: float,
    timeout: float,
) -> AuditRun:
    from xai import Client

    with Client(url, timeout=600) as client:
        start = time.perf_counter()
        # exactly what Client.audit sends: the DataFrame's rows in the model's feature order
        explained = client._request_body(name, frame, {"chunk_size": chunk_size})
        body = {"kind": "audit", "model": name, "explainer": "shapley", **explained}
        job_id = client.submit(body, idempotency_key=f"tree-audit-bench-{uuid.uuid4().hex}")
        submitted = time.perf_counter()
        samples: list[tuple[float, int]] = []
        timed_out = False
        while True:
            status = client.job(job_id)
            now = time.perf_counter()
            samples.append((now - submitted, int(status["progress"]["done"])))
            if status["status"] not in UNFINISHED:
                break
            if now - submitted > timeout:
                timed_out = True
                client.cancel(job_id)
                status = client.job(job_id)
                break
            time.sleep(poll)
        fetched = time.perf_counter()
        results = list(client.results(job_id))
        end = time.perf_counter()
    answers: dict[int, tuple[int, list[float]]] = {}
    outputs: dict[int, int] = {}
    names: set[str] = set()
    errors: dict[str, int] = {}
    with_values = 0
    for r in results:
        e = r.get("explanation")
        if e is None and r.get("explanations"):
            e = r["explanations"][0]
        if e is None or not e.get("values"):
            code = str(r.get("code") or r.get("error") or "no values")
            errors[code] = errors.get(code, 0) + 1
            continue
        with_values += 1
        out = int(e["output_index"])
        outputs[out] = outputs.get(out, 0) + 1
        names.add(str(e.get("output_name")))
        if int(r["index"]) in picks:
            answers[int(r["index"])] = (out, list(e["values"]))
    summary = status.get("summary") or {}
    return AuditRun(
        seconds=end - start,
        submit_s=submitted - start,
        download_s=end - fetched,
        status=str(status["status"]),
        samples=samples,
        results=len(results),
        missing=len(frame) - with_values,
        errors=errors,
        output_indices=outputs,
        output_names=sorted(names),
        cache_hits=summary.get("cache_hits"),
        answers=answers,
        job_id=job_id,
        timed_out=timed_out,
    )


def rate(rows: int, seconds: float) -> float:
    return rows / seconds if seconds > 0 else float("nan")


def fmt(x: float | None, digits: int = 1) -> str:
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x:,.{digits}f}"


def bench_size(
    n: int,
    size_index: int,
    args: argparse.Namespace,
    booster: Any,
    server: Server,
    name: str,
) -> dict[str, Any]:
    load_start = os.getloadavg()
    frame = make_rows(n, 1000 + size_index)
    rows = frame.to_numpy()
    picks_arr = np.sort(np.random.default_rng(7).choice(n, size=min(CHECK_ROWS, n), replace=False))
    picks = {int(i) for i in picks_arr}
    print(f"\n== {n:,} rows: shap in process ...", flush=True)
    shap_s, reference = run_shap(booster, frame)
    print(f"   {shap_s:.2f} s; the audit ...", flush=True)
    audit = run_audit(server.url, name, frame, picks, args.chunk_size, args.poll, args.timeout)
    print(f"   {audit.seconds:.2f} s ({audit.status}); the sync route ...", flush=True)
    sync_s, sync_answers, sync_rows = run_sync(server.url, name, rows, picks)
    print(f"   {sync_s:.2f} s", flush=True)
    load_end = os.getloadavg()

    done = audit.results - sum(audit.errors.values())
    quarters = quarter_rates(audit.samples, n, args.poll)
    audit_check = check_values(reference, audit.answers, picks_arr)
    sync_check = check_values(reference, sync_answers, picks_arr)
    shap_rate = rate(n, shap_s)
    sync_rate = rate(sync_rows, sync_s)
    audit_rate = rate(done, audit.seconds)
    figures: dict[str, Any] = {
        "rows": n,
        "shap": {"seconds": shap_s, "rows_per_s": shap_rate},
        "sync": {
            "seconds": sync_s,
            "rows_per_s": sync_rate,
            "requests": -(-n // SYNC_BATCH),
            "rows_explained": sync_rows,
            "check": asdict(sync_check),
        },
        "audit": {
            "seconds": audit.seconds,
            "rows_per_s": audit_rate,
            "submit_s": audit.submit_s,
            "download_s": audit.download_s,
            "status": audit.status,
            "timed_out": audit.timed_out,
            "job_id": audit.job_id,
            "results": audit.results,
            "rows_without_values": audit.missing,
            "errors": audit.errors,
            "output_indices": {str(k): v for k, v in audit.output_indices.items()},
            "output_names": audit.output_names,
            "cache_hits": audit.cache_hits,
            "first_quarter_rows_per_s": quarters.first,
            "last_quarter_rows_per_s": quarters.last,
            "last_over_first_quarter": quarters.ratio,
            "quarter_note": quarters.note,
            "progress_samples": audit.samples,
            "check": asdict(audit_check),
        },
        "ratios": {
            "audit_over_shap": audit_rate / shap_rate,
            "sync_over_shap": sync_rate / shap_rate,
            "audit_over_sync": audit_rate / sync_rate,
            "last_over_first_quarter": quarters.ratio,
        },
        "loadavg_start": list(load_start),
        "loadavg_end": list(load_end),
    }
    print_table(figures)
    return figures


def print_table(f: dict[str, Any]) -> None:
    a, s, y, r = f["audit"], f["shap"], f["sync"], f["ratios"]
    print(f"\n{f['rows']:,} rows")
    print(f"  {'':34}{'seconds':>10}{'rows/s':>14}")
    print(
        f"  {'shap TreeExplainer (in process)':34}{s['seconds']:>10.2f}{fmt(s['rows_per_s']):>14}"
    )
    label = f"sync route ({y['requests']} x {SYNC_BATCH})"
    print(f"  {label:34}{y['seconds']:>10.2f}{fmt(y['rows_per_s']):>14}")
    label = f"audit ({a['status']}{', TIMED OUT' if a['timed_out'] else ''})"
    print(f"  {label:34}{a['seconds']:>10.2f}{fmt(a['rows_per_s']):>14}")
    print(f"    submit {a['submit_s']:.2f} s, download {a['download_s']:.2f} s")
    print(
        f"    first quarter {fmt(a['first_quarter_rows_per_s'])} rows/s, last quarter "
        f"{fmt(a['last_quarter_rows_per_s'])} rows/s"
        + (f" ({a['quarter_note']})" if a["quarter_note"] else "")
    )
    print(
        f"  ratios: audit/shap {fmt(r['audit_over_shap'], 4)}, sync/shap "
        f"{fmt(r['sync_over_shap'], 4)}, audit/sync {fmt(r['audit_over_sync'], 4)}, "
        f"last/first quarter {fmt(r['last_over_first_quarter'], 2)}"
    )
    outs = ", ".join(f"index {k} ({v} rows)" for k, v in a["output_indices"].items()) or "none"
    print(
        f"  audit explained output {outs}, named {a['output_names']} "
        "(binary: index 1 is the positive class's log-odds, index 0 minus it)"
    )
    for label, c in (("audit", a["check"]), ("sync ", y["check"])):
        print(
            f"  {label} vs shap on {c['rows']} sampled rows: max |diff| "
            f"{fmt(c['max_abs_diff'], 8)} (scale {c['scale']:.3f}, tolerance "
            f"{REL_TOL * max(1.0, c['scale']):.1e}): {'ok' if c['ok'] else 'MISMATCH'}"
        )
    if a["rows_without_values"]:
        print(f"  audit rows without values: {a['rows_without_values']} {a['errors']}")
    print(f"  audit cache hits: {a['cache_hits']}")
    print(
        "  load average: start "
        + " ".join(f"{x:.2f}" for x in f["loadavg_start"])
        + ", end "
        + " ".join(f"{x:.2f}" for x in f["loadavg_end"])
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="5000,50000", help="explicand counts, comma-separated")
    parser.add_argument("--redis", default=None, help="REDIS_URL for the server (and workers)")
    parser.add_argument("--workers", type=int, default=1, help="Celery workers with --redis")
    parser.add_argument("--database-url", default=None, help="job database (default: temp SQLite)")
    parser.add_argument("--chunk-size", type=int, default=None, help="the job's chunk_size")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per audit")
    parser.add_argument("--poll", type=float, default=0.5, help="progress polling interval (s)")
    parser.add_argument("--out", default="/tmp/tree_audit_bench.json")
    parser.add_argument("--keep-server-log", action="store_true")
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="MODEL_DIR for the built-ins (default: a fresh temp folder, trained at start); "
        "a folder of your own is reused by later runs",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.rows.split(",") if s.strip()]
    if not sizes or min(sizes) < 1:
        parser.error("--rows: positive integers, comma-separated")

    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="tree-audit-bench-"))
    print(
        f"{os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in load_start)}; "
        f"sizes {sizes}; work folder {tmp}",
        flush=True,
    )
    model_path = tmp / "classifier.json"
    t = time.perf_counter()
    booster = train(model_path)
    print(
        f"trained XGBClassifier(200 trees, depth 6) on {N_TRAIN:,} rows in "
        f"{time.perf_counter() - t:.1f} s",
        flush=True,
    )
    env = server_env(args, tmp)
    name = f"tree-bench-{uuid.uuid4().hex[:8]}"  # a fresh name: no cached answers from before
    server: Server | None = None
    report: dict[str, Any] = {
        "cores": os.cpu_count(),
        "loadavg_start": list(load_start),
        "model": {
            "name": name,
            "trees": 200,
            "max_depth": 6,
            "features": N_FEATURES,
            "train_rows": N_TRAIN,
        },
        "server": {
            "redis": args.redis,
            "database_url": env["DATABASE_URL"],
            "chunk_size": args.chunk_size,
        },
        "sizes": [],
    }
    try:
        t = time.perf_counter()
        server = start_server(env, tmp, args.workers)
        print(f"server ready at {server.url} in {time.perf_counter() - t:.1f} s", flush=True)
        meta = register(server.url, name, model_path)
        print(
            f"registered {name}: {meta.get('task')}, outputs {meta.get('output_names')}",
            flush=True,
        )
        for k, n in enumerate(sizes):
            report["sizes"].append(bench_size(n, k, args, booster, server, name))
            Path(args.out).write_text(json.dumps(report, indent=1))
    except Exception:
        if server is not None:
            print(f"--- server log (last lines) ---\n{server.tail()}", file=sys.stderr)
        raise
    finally:
        if server is not None:
            server.stop()
        report["loadavg_end"] = list(os.getloadavg())
        Path(args.out).write_text(json.dumps(report, indent=1))
        if args.keep_server_log and (tmp / "server.log").exists():
            log = Path(tempfile.mkdtemp(prefix="tree-audit-bench-log-")) / "server.log"
            shutil.move(tmp / "server.log", log)
            print(f"server log: {log}")
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\nload average at the end: {' '.join(f'{x:.2f}' for x in report['loadavg_end'])}; "
        f"figures in {args.out}"
    )


if __name__ == "__main__":
    main()
