"""Chunk leases and attempts (app/jobs/leases.py) on a real SQLite store, and an in-process
server restarted after a crash inside a chunk: it runs the chunk again, or, with no attempts
left, fails the job with the reason instead of running it (no crash loop)."""

from __future__ import annotations

import time
from pathlib import Path

from app.jobs.leases import LOST, ChunkStore
from app.jobs.store import JobStore
from models.registry import ModelRegistry
from tests.app.test_jobs import AUDIT, app_for, lines, wait


def test_claims_count_dead_holders_and_raised_attempts(tmp_path: Path) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    chunks = ChunkStore(store)
    job, _ = store.create("audit", "m", {}, total=10, chunk_size=5)
    assert chunks.claim(job.id, 0, "a", lease_s=0.3, max_failures=2).state == "claimed"
    assert store.get(job.id).status == "running"  # type: ignore[union-attr]
    assert chunks.claim(job.id, 0, "b", 30, 2).state == "held"  # a's lease runs
    time.sleep(0.4)  # a died: its lease lapsed; b's claim counts that attempt as failed
    assert chunks.claim(job.id, 0, "b", 30, 2).state == "claimed"
    # b could not write (database down); its retry names b, which is no failure
    assert chunks.claim(job.id, 0, "c", 30, 2, previous="b").state == "claimed"
    assert chunks.renew(job.id, 0, "c", 30) and not chunks.renew(job.id, 0, "b", 30)
    assert chunks.fail(job.id, 0, "c", "ModelWorkerError: the worker died") == 2
    claim = chunks.claim(job.id, 0, "d", 30, 2)
    assert claim.state == "failed"
    expected = "chunk 0 failed 2 times; the last: ModelWorkerError: the worker died"
    assert claim.error == expected
    failed = store.get(job.id)
    assert failed is not None and failed.status == "failed" and failed.error == expected
    assert chunks.claim(job.id, 1, "e", 30, 2).state == "finished"


def test_stale_chunks_are_queued_again_once(tmp_path: Path) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.db'}")
    chunks = ChunkStore(store)
    job, _ = store.create("audit", "m", {}, total=10, chunk_size=5)
    chunks.unqueued(job.id, 1)  # its submission failed
    stale, complete = chunks.stale(None)
    assert [(c.job_id, c.idx) for c in stale] == [(job.id, 1)] and complete == []
    assert chunks.requeue(stale[0]) and not chunks.requeue(stale[0])  # a second sweeper
    assert chunks.stale(None)[0] == []
    assert chunks.claim(job.id, 0, "a", 0.1, 3).state == "claimed"
    time.sleep(0.2)  # its holder died
    stale = chunks.stale(None)[0]
    assert [c.idx for c in stale] == [0] and chunks.requeue(stale[0])
    assert chunks.stale(None)[0] == []  # once per lapse
    assert [c.idx for c in chunks.stale(lost_after_s=0.0)[0]] == [0, 1]  # a lost message
    chunks.complete(job.id, 0)
    chunks.complete(job.id, 1)
    assert chunks.stale(0.0) == ([], [job.id])  # done, not finished: the sweeper finishes it


def _crashed_inside_chunk_0(db: str, registry: ModelRegistry, model_dir: Path) -> str:
    """A job stored by a server without job threads, then the state a server killed inside
    its chunk 0 leaves: a holder whose lease lapsed (pid 0: no process)."""
    with app_for(db, registry, model_dir, job_workers=0) as client:
        job_id = str(client.post("/v2/jobs", json=AUDIT).json()["id"])
    ChunkStore(JobStore(db)).claim(job_id, 0, "0-crashed", lease_s=0.1, max_failures=3)
    time.sleep(0.2)
    return job_id


def test_restart_runs_a_crashed_chunk_again(
    tmp_path: Path, registry: ModelRegistry, model_dir: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    job_id = _crashed_inside_chunk_0(db, registry, model_dir)
    with app_for(db, registry, model_dir, job_sweep_interval_s=0.2) as client:
        status = wait(client, job_id)
        assert status["status"] == "succeeded", status
        assert [x["index"] for x in lines(client, job_id)] == list(range(40))


def test_restart_fails_a_chunk_without_attempts_left(
    tmp_path: Path, registry: ModelRegistry, model_dir: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    job_id = _crashed_inside_chunk_0(db, registry, model_dir)
    with app_for(db, registry, model_dir, job_max_attempts=1) as client:
        status = wait(client, job_id)
        assert status["status"] == "failed", status
        assert status["error"] == f"chunk 0 failed 1 time; the last: {LOST}"
