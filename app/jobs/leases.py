"""Who runs each chunk of a job: leases, attempts and what the sweeper queues again.

A worker *claims* a chunk before running it: it becomes the chunk's holder for a lease that
it renews while it runs (runner.Lease). A chunk whose holder's lease lapsed was left by a
worker that died (killed, crashed, its machine gone); the next claim counts that attempt as
failed, and so does an attempt that raised. After `max_failures` failed attempts the job fails
with the last error instead of running again (a model that crashes its process would otherwise
crash-loop every worker and every restart that resumes it).

The queue delivers chunks; this table is the truth about them. A message the broker lost, a
chunk whose submission failed (broker down) and a chunk of a dead worker are found by `stale`
and queued again; every claim, renewal and re-queue is a compare-and-set on the chunk's row, so
several sweepers (one per worker or API process) queue each chunk once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal, cast

from sqlalchemy import Boolean, CursorResult, Float, Integer, String, Text, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.jobs.store import FINISHED, Job, JobRow, JobStore, _job

LOST = "the worker running it stopped before it finished (killed, or its model crashed it)"


def failed_message(idx: int, failures: int, error: str | None) -> str:
    """The error of a job failed by a chunk's failed attempts."""
    times = "time" if failures == 1 else "times"
    return f"chunk {idx} failed {failures} {times}; the last: {error}"


class ChunkBase(DeclarativeBase):
    pass


class ChunkRow(ChunkBase):
    """One chunk of a job; created at its first claim or sweep (older jobs have none)."""

    __tablename__ = "job_chunks"

    job_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    done: Mapped[bool] = mapped_column(Boolean, default=False)
    # the running attempt: "<pid>-<random>" of the process that runs it
    holder: Mapped[str | None] = mapped_column(String(32), nullable=True)
    lease_until: Mapped[float | None] = mapped_column(Float, nullable=True)
    enqueued_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: not queued
    enqueues: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # claims
    failures: Mapped[int] = mapped_column(Integer, default=0)  # attempts that raised or died
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # the last failure


ClaimState = Literal["claimed", "held", "done", "finished", "failed"]


@dataclass(frozen=True)
class Claim:
    """A claim's outcome: claimed (run it), held (another live worker runs it), done (its
    results are stored), finished (the job is), failed (too many failed attempts: the job
    failed with `error`)."""

    state: ClaimState
    job: Job | None = None
    error: str | None = None


@dataclass(frozen=True)
class Stale:
    """A chunk to queue again, with the row values its compare-and-set expects."""

    job_id: str
    idx: int
    enqueued_at: float | None
    attempts: int


def _same(column: Any, value: Any) -> Any:
    return column.is_(None) if value is None else column == value


class ChunkStore:
    """The job_chunks table beside a JobStore's jobs (same database; made if missing)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.session = store.session
        ChunkBase.metadata.create_all(store.engine)

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        """Insert chunk rows that do not exist yet."""
        if not rows:
            return
        dialect = self.store.engine.dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        with self.session.begin() as s:
            s.execute(insert(ChunkRow).values(rows).on_conflict_do_nothing())

    def claim(
        self,
        job_id: str,
        idx: int,
        token: str,
        lease_s: float,
        max_failures: int,
        previous: str | None = None,
    ) -> Claim:
        """Become the chunk's holder as `token`. `previous`: the token of this worker's own
        earlier attempt that could not release the chunk (the database was down); it is not
        counted as failed."""
        for _ in range(3):  # a concurrent claim changed the row: read it again
            claim = self._try_claim(job_id, idx, token, lease_s, max_failures, previous)
            if claim is not None:
                return claim
        return Claim("held")

    def _try_claim(
        self,
        job_id: str,
        idx: int,
        token: str,
        lease_s: float,
        max_failures: int,
        previous: str | None,
    ) -> Claim | None:
        with self.session() as s:
            job = s.get(JobRow, job_id)
            if job is None or job.status in FINISHED:
                return Claim("finished")
            row = s.get(ChunkRow, (job_id, idx))
        if row is None:
            self._insert([{"job_id": job_id, "idx": idx, "enqueued_at": job.created_at}])
            return None
        if row.done:
            return Claim("done", _job(job))
        now = time.time()
        failures, error = row.failures, row.error
        if row.holder is not None and row.holder != previous:
            if (row.lease_until or 0) >= now:
                return Claim("held")
            failures, error = failures + 1, LOST  # its worker died
        values: dict[str, Any] = {"failures": failures, "error": error}
        if failures >= max_failures:
            values.update(holder=None, lease_until=None)
        else:
            values.update(holder=token, lease_until=now + lease_s, attempts=row.attempts + 1)
        with self.session.begin() as s:
            changed = s.execute(
                update(ChunkRow)
                .where(
                    ChunkRow.job_id == job_id,
                    ChunkRow.idx == idx,
                    _same(ChunkRow.holder, row.holder),
                    ChunkRow.attempts == row.attempts,
                )
                .values(**values)
            )
            if not cast(CursorResult[Any], changed).rowcount:
                return None
            if failures >= max_failures:
                message = failed_message(idx, failures, error)
                s.execute(
                    update(JobRow)
                    .where(JobRow.id == job_id, JobRow.status.in_(("queued", "running")))
                    .values(status="failed", error=message, finished_at=now)
                )
                return Claim("failed", error=message)
            s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == "queued")
                .values(status="running", started_at=now)
            )
        return Claim("claimed", _job(job))

    def renew(self, job_id: str, idx: int, token: str, lease_s: float) -> bool:
        """Extend the lease while `token` holds the chunk; False if it no longer does."""
        with self.session.begin() as s:
            changed = s.execute(
                update(ChunkRow)
                .where(ChunkRow.job_id == job_id, ChunkRow.idx == idx, ChunkRow.holder == token)
                .values(lease_until=time.time() + lease_s)
            )
            return bool(cast(CursorResult[Any], changed).rowcount)

    def release(self, job_id: str, idx: int, token: str, requeued: bool = False) -> None:
        """Give the chunk up without a failure (cancelled, shutting down); `requeued`: it
        was put back in the queue; else the next sweep queues it."""
        values: dict[str, Any] = {"holder": None, "lease_until": None}
        values["enqueued_at"] = time.time() if requeued else None
        with self.session.begin() as s:
            s.execute(
                update(ChunkRow)
                .where(ChunkRow.job_id == job_id, ChunkRow.idx == idx, ChunkRow.holder == token)
                .values(**values)
            )

    def fail(self, job_id: str, idx: int, token: str, error: str) -> int:
        """Record a failed attempt (it raised `error`) and give the chunk up; the chunk's
        failed attempts so far."""
        with self.session.begin() as s:
            s.execute(
                update(ChunkRow)
                .where(ChunkRow.job_id == job_id, ChunkRow.idx == idx, ChunkRow.holder == token)
                .values(
                    failures=ChunkRow.failures + 1,
                    error=error,
                    holder=None,
                    lease_until=None,
                    enqueued_at=time.time(),
                )
            )
            failures = s.scalar(
                select(ChunkRow.failures).where(ChunkRow.job_id == job_id, ChunkRow.idx == idx)
            )
        return int(failures or 0)

    def complete(self, job_id: str, idx: int) -> None:
        """Every result of the chunk is stored."""
        with self.session.begin() as s:
            s.execute(
                update(ChunkRow)
                .where(ChunkRow.job_id == job_id, ChunkRow.idx == idx)
                .values(done=True, holder=None, lease_until=None)
            )

    def unqueued(self, job_id: str, idx: int) -> None:
        """The chunk's submission failed (broker down): the next sweep queues it."""
        self._insert([{"job_id": job_id, "idx": idx, "enqueued_at": None}])
        with self.session.begin() as s:
            s.execute(
                update(ChunkRow)
                .where(ChunkRow.job_id == job_id, ChunkRow.idx == idx, ChunkRow.holder.is_(None))
                .values(enqueued_at=None)
            )

    def stale(
        self, lost_after_s: float | None, lost_before: float | None = None
    ) -> tuple[list[Stale], list[str]]:
        """Chunks of unfinished jobs to queue again, and the unfinished jobs whose chunks are
        all done (their finishing write failed). A chunk is queued again when it was never
        queued (its submission failed), when its holder's lease lapsed (once per lapse), or,
        with `lost_after_s`, when it waited that long unclaimed (a message the broker lost;
        the wait doubles with each re-queue, so a long queue is not flooded with copies), and
        when it was queued before `lost_before` (the time its broker was seen restarted)."""
        columns = (JobRow.id, JobRow.total, JobRow.chunk_size, JobRow.created_at)
        unfinished = JobRow.status.in_(("queued", "running"))
        with self.session() as s:  # not the requests: they may be megabytes
            jobs = [
                (i, -(-t // c), at) for i, t, c, at in s.execute(select(*columns).where(unfinished))
            ]
            if not jobs:
                return [], []
            query = select(ChunkRow).where(ChunkRow.job_id.in_([j[0] for j in jobs]))
            rows = {(r.job_id, r.idx): r for r in s.scalars(query)}
        missing = [
            {"job_id": job_id, "idx": i, "enqueued_at": created}
            for job_id, n_chunks, created in jobs
            for i in range(n_chunks)
            if (job_id, i) not in rows
        ]
        if missing:  # jobs from before this table, or not claimed yet: look again next time
            self._insert(missing)
        now = time.time()
        stale, complete = [], []
        for job_id, n_chunks, _ in jobs:
            chunks = [rows.get((job_id, i)) for i in range(n_chunks)]
            if all(c is not None and c.done for c in chunks):
                complete.append(job_id)
            for c in chunks:
                if c is not None and not c.done and _is_stale(c, now, lost_after_s, lost_before):
                    stale.append(Stale(c.job_id, c.idx, c.enqueued_at, c.attempts))
        return stale, complete

    def requeue(self, chunk: Stale) -> bool:
        """Mark the chunk queued again now, if no other sweeper did; False if one did."""
        with self.session.begin() as s:
            changed = s.execute(
                update(ChunkRow)
                .where(
                    ChunkRow.job_id == chunk.job_id,
                    ChunkRow.idx == chunk.idx,
                    _same(ChunkRow.enqueued_at, chunk.enqueued_at),
                    ChunkRow.attempts == chunk.attempts,
                    ChunkRow.done.is_(False),
                )
                .values(enqueued_at=time.time(), enqueues=ChunkRow.enqueues + 1)
            )
            return bool(cast(CursorResult[Any], changed).rowcount)


def _is_stale(
    c: ChunkRow, now: float, lost_after_s: float | None, lost_before: float | None = None
) -> bool:
    lapsed = c.holder is not None and (c.lease_until or 0) < now
    if c.holder is not None and not lapsed:
        return False  # a live worker holds it
    if c.enqueued_at is None:
        return True
    if lost_before is not None and c.enqueued_at < lost_before:
        return True  # queued in a broker that restarted since
    if lapsed and c.enqueued_at < (c.lease_until or 0):
        return True  # not queued again since its holder died
    if lost_after_s is None:
        return False
    return c.enqueued_at < now - lost_after_s * 2 ** min(max(c.enqueues - 1, 0), 6)
