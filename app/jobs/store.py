"""Durable job records and per-instance results in SQL (SQLAlchemy; SQLite or PostgreSQL).

A job belongs to the API key that submitted it (`owner`, the key's name; None when the service
was open). The query functions take `owner`: given, they see only that owner's jobs (a `jobs`
key); None, every job (an admin key, or an open service). Rows from before the column existed
(owner NULL) are an admin's. Idempotency keys are per owner (`scoped_key`).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    CursorResult,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    create_engine,
    func,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from app.errors import ApiError, NotFound
from app.jobs.unavailable import watch_engine
from models.base import Model

RECEIVING = "receiving"  # an uploaded job whose instances are still being read: nothing runs
# succeeded_with_errors: finished with every row stored, some of them errors
FINISHED = ("succeeded", "succeeded_with_errors", "failed", "cancelled")


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    total: Mapped[int] = mapped_column(Integer)
    done: Mapped[int] = mapped_column(Integer, default=0)
    chunk_size: Mapped[int] = mapped_column(Integer)
    request: Mapped[str] = mapped_column(Text)
    summary: Mapped[str | None] = mapped_column(Text, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The client's key as sent when the job has no owner, else scoped_key(owner, key).
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    owner: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)


class InputRow(Base):
    """One chunk's instances as a JSON list: a chunk reads its own rows, and a status read
    (cancel checks, polls) parses no instance. Jobs stored before this table keep theirs in
    the request's `inputs`."""

    __tablename__ = "job_inputs"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    chunk: Mapped[int] = mapped_column(Integer, primary_key=True)
    payload: Mapped[str] = mapped_column(Text)


class ResultRow(Base):
    __tablename__ = "job_results"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)  # one result per instance
    payload: Mapped[str] = mapped_column(Text)


@dataclass(frozen=True)
class Job:
    id: str
    kind: str
    model: str
    status: str
    total: int
    done: int
    chunk_size: int
    request: dict[str, Any]
    summary: dict[str, Any] | None
    error: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    owner: str | None = None  # the submitting key's name; None: open service or older row

    @property
    def n_chunks(self) -> int:
        return -(-self.total // self.chunk_size)

    def chunk(self, index: int) -> range:
        return range(index * self.chunk_size, min(self.total, (index + 1) * self.chunk_size))


def _job(row: JobRow) -> Job:
    return Job(
        row.id,
        row.kind,
        row.model,
        row.status,
        row.total,
        row.done,
        row.chunk_size,
        json.loads(row.request),
        None if row.summary is None else json.loads(row.summary),
        row.error,
        row.created_at,
        row.started_at,
        row.finished_at,
        row.owner,
    )


def with_index(idx: int, payload: str) -> str:
    """A stored payload (a JSON object) as a results line: {"index": idx, ...the payload}."""
    if payload.startswith("{") and payload.rstrip() != "{}":
        return f'{{"index": {idx}, {payload[1:]}\n'
    return json.dumps({"index": idx, **json.loads(payload)}) + "\n"


def scoped_key(owner: str | None, key: str) -> str:
    """What the idempotency column holds: the key as sent for an open service (as before),
    else a digest of (owner, key), so that two keys' `audit-1` are two jobs (and the column's
    unique constraint and 200 characters hold for any key name)."""
    if owner is None:
        return key
    return "owned:" + hashlib.sha256(json.dumps([owner, key]).encode()).hexdigest()


def add_owner_column(engine: Any) -> None:
    """Databases made before jobs had owners get the column (NULL: an admin's jobs)."""
    columns = {c["name"] for c in inspect(engine).get_columns("jobs")}
    if "owner" in columns:
        return
    exists = "IF NOT EXISTS " if engine.dialect.name == "postgresql" else ""
    try:
        with engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE jobs ADD COLUMN {exists}owner VARCHAR(200)"))
    except OperationalError:  # SQLite: another process added it a moment ago
        if "owner" not in {c["name"] for c in inspect(engine).get_columns("jobs")}:
            raise
    with engine.begin() as conn:
        conn.execute(text("CREATE INDEX IF NOT EXISTS ix_jobs_owner ON jobs (owner)"))


class JobStore:
    """Jobs and results; every write is a short transaction, safe across processes."""

    def __init__(self, url: str) -> None:
        connect_args: dict[str, Any] = {"timeout": 30} if url.startswith("sqlite") else {}
        if url.startswith("postgresql"):  # a server that does not answer: 503 in 5 s
            connect_args["connect_timeout"] = 5
        self.engine = create_engine(url, pool_pre_ping=True, connect_args=connect_args)
        watch_engine(self.engine)  # connection failures: JobStoreUnavailable (503)
        self.session = sessionmaker(self.engine, expire_on_commit=False)
        Base.metadata.create_all(self.engine)
        add_owner_column(self.engine)

    def create(
        self,
        kind: str,
        model: str,
        request: dict[str, Any],
        total: int,
        chunk_size: int,
        idempotency_key: str | None = None,
        owner: str | None = None,
        inputs: list[Any] | None = None,
        status: str = "queued",
    ) -> tuple[Job, bool]:
        """Insert a queued job of `owner`, its `inputs` (an audit's instances) stored a chunk
        a row (InputRow); with an idempotency key this owner used before return that job
        (False)."""
        scoped = None if idempotency_key is None else scoped_key(owner, idempotency_key)
        if scoped is not None:
            existing = self.by_key(scoped)
            if existing is not None:
                return existing, False
        row = JobRow(
            id=uuid.uuid4().hex,
            kind=kind,
            model=model,
            status=status,
            total=total,
            done=0,
            chunk_size=chunk_size,
            request=json.dumps(request),
            idempotency_key=scoped,
            created_at=time.time(),
            owner=owner,
        )
        chunks = []
        if inputs is not None:
            chunks = [
                InputRow(job_id=row.id, chunk=c, payload=json.dumps(inputs[at : at + chunk_size]))
                for c, at in enumerate(range(0, len(inputs), chunk_size))
            ]
        try:
            with self.session.begin() as s:
                s.add(row)
                s.flush()  # the job row before its inputs (their foreign key)
                s.add_all(chunks)
        except IntegrityError:  # a concurrent submission with the same key won
            existing = self.by_key(scoped or "")
            if existing is None:
                raise
            return existing, False
        return _job(row), True

    def by_key(self, key: str) -> Job | None:
        """The job whose idempotency column holds `key` (scoped_key's value)."""
        with self.session() as s:
            row = s.scalars(select(JobRow).where(JobRow.idempotency_key == key)).first()
            return None if row is None else _job(row)

    def get(self, job_id: str, owner: str | None = None) -> Job | None:
        """The job; with `owner`, only when it is that owner's (else None, as if unknown)."""
        with self.session() as s:
            row = s.get(JobRow, job_id)
            if row is None or (owner is not None and row.owner != owner):
                return None
            return _job(row)

    def append_inputs(self, job_id: str, chunk: int, rows: list[Any]) -> None:
        """Store one chunk's instances of a job still `receiving` its upload."""
        with self.session.begin() as s:
            s.add(InputRow(job_id=job_id, chunk=chunk, payload=json.dumps(rows)))

    def received(self, job_id: str, total: int) -> Job:
        """A `receiving` job's upload is complete: `total` instances, queued now."""
        with self.session.begin() as s:
            s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == RECEIVING)
                .values(status="queued", total=total)
            )
            row = s.get(JobRow, job_id)
            if row is None:
                raise NotFound(f"unknown job {job_id!r}", code="unknown_job")
            return _job(row)

    def discard(self, job_id: str) -> None:
        """Delete a job that never ran (an upload that failed half-way) with its inputs."""
        with self.session.begin() as s:
            s.query(InputRow).filter(InputRow.job_id == job_id).delete()
            s.query(ResultRow).filter(ResultRow.job_id == job_id).delete()
            s.query(JobRow).filter(JobRow.id == job_id).delete()

    def status(self, job_id: str) -> str | None:
        """The job's status column alone (None: no such job): what cancel checks read."""
        with self.session() as s:
            return s.scalar(select(JobRow.status).where(JobRow.id == job_id))

    def inputs(self, job: Job, indices: range) -> dict[int, Any]:
        """The instances at `indices` (within one chunk), read from that chunk's row; a job
        stored before InputRow keeps them in its request."""
        if "inputs" in job.request:
            return {i: job.request["inputs"][i] for i in indices}
        if not indices:
            return {}
        chunk = indices.start // job.chunk_size
        with self.session() as s:
            payload = s.scalar(
                select(InputRow.payload).where(InputRow.job_id == job.id, InputRow.chunk == chunk)
            )
        if payload is None:
            raise KeyError(f"job {job.id} has no inputs stored for chunk {chunk}")
        rows = json.loads(payload)
        first = chunk * job.chunk_size
        return {i: rows[i - first] for i in indices}

    def recent(
        self, limit: int = 100, status: str | None = None, owner: str | None = None
    ) -> list[Job]:
        """The latest jobs, newest first; with `owner`, only that owner's."""
        with self.session() as s:
            query = select(JobRow).order_by(JobRow.created_at.desc()).limit(limit)
            if status is not None:
                query = query.where(JobRow.status == status)
            if owner is not None:
                query = query.where(JobRow.owner == owner)
            return [_job(r) for r in s.scalars(query)]

    def unfinished(self) -> list[Job]:
        with self.session() as s:
            rows = s.scalars(select(JobRow).where(JobRow.status.in_(("queued", "running"))))
            return [_job(r) for r in rows]

    def mark_running(self, job_id: str) -> None:
        with self.session.begin() as s:
            s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == "queued")
                .values(status="running", started_at=time.time())
            )

    def add_results(self, job_id: str, results: Mapping[int, dict[str, Any] | str]) -> int:
        """Store results (JSON objects, or their JSON text), ignoring instances already stored
        and any result of a job that was cancelled or failed; returns results now stored.
        `done` grows by the rows this write added (counted over the written range, not the
        whole job: linear in a job's size)."""
        if not results:
            with self.session() as s:
                return int(s.scalar(select(JobRow.done).where(JobRow.id == job_id)) or 0)
        rows = [
            {"job_id": job_id, "idx": i, "payload": r if isinstance(r, str) else json.dumps(r)}
            for i, r in results.items()
        ]
        low, high = min(results), max(results)

        def in_range() -> Any:
            return (
                select(func.count())
                .where(ResultRow.job_id == job_id, ResultRow.idx >= low, ResultRow.idx <= high)
                .scalar_subquery()
            )

        dialect = self.engine.dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        with self.session.begin() as s:
            # Under the job row's lock: a job cancelled (or failed) meanwhile gets nothing
            # more, even from a chunk that passed its last cancel check a moment ago; and
            # concurrent writes to one range count their rows one after the other.
            status = s.scalar(select(JobRow.status).where(JobRow.id == job_id).with_for_update())
            if status not in ("cancelled", "failed"):
                before = int(s.scalar(select(in_range())) or 0)
                # executemany of one cached statement (not a statement of len(rows) VALUES)
                s.execute(insert(ResultRow).on_conflict_do_nothing(), rows)
                added = int(s.scalar(select(in_range())) or 0) - before
                if added:
                    s.execute(
                        update(JobRow).where(JobRow.id == job_id).values(done=JobRow.done + added)
                    )
            done = s.scalar(select(JobRow.done).where(JobRow.id == job_id)) or 0
        return int(done)

    def recount(self, job_id: str) -> int:
        """Set `done` to the results stored (one full count: a job's end, or a repair)."""
        count = select(func.count()).where(ResultRow.job_id == job_id).scalar_subquery()
        with self.session.begin() as s:
            s.execute(update(JobRow).where(JobRow.id == job_id).values(done=count))
            return int(s.scalar(select(JobRow.done).where(JobRow.id == job_id)) or 0)

    def stored_indices(self, job_id: str, indices: range) -> set[int]:
        with self.session() as s:
            query = select(ResultRow.idx).where(
                ResultRow.job_id == job_id,
                ResultRow.idx >= indices.start,
                ResultRow.idx < indices.stop,
            )
            return set(s.scalars(query))

    def finish(
        self,
        job_id: str,
        status: str,
        summary: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> bool:
        """Move an unfinished job to a final status; False if it had already finished."""
        with self.session.begin() as s:
            result = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status.in_(("queued", "running")))
                .values(
                    status=status,
                    finished_at=time.time(),
                    error=error,
                    summary=None if summary is None else json.dumps(summary),
                )
            )
            return bool(cast(CursorResult[Any], result).rowcount)

    def results(self, job_id: str, offset: int = 0, limit: int | None = None) -> Iterator[str]:
        """Stored result payloads in instance order, from `offset`, as JSON lines."""
        for page in self.result_pages(job_id, offset, limit):
            yield from page

    def result_pages(
        self, job_id: str, offset: int = 0, limit: int | None = None, page: int = 2000
    ) -> Iterator[list[str]]:
        """`results` a page at a time: a million rows stream out without being held at once.
        Each line is the stored payload with its `index` put first, without decoding it."""
        for rows in self.payload_pages(job_id, offset, limit, page):
            yield [with_index(idx, payload) for idx, payload in rows]

    def payload_pages(
        self, job_id: str, offset: int = 0, limit: int | None = None, page: int = 2000
    ) -> Iterator[list[tuple[int, str]]]:
        """Stored (index, payload) pairs in instance order, a page at a time (one query each,
        from the last index read)."""
        left = limit
        while left is None or left > 0:
            size = page if left is None else min(page, left)
            with self.session() as s:
                query = (
                    select(ResultRow.idx, ResultRow.payload)
                    .where(ResultRow.job_id == job_id, ResultRow.idx >= offset)
                    .order_by(ResultRow.idx)
                    .limit(size)
                )
                rows = [(int(i), str(p)) for i, p in s.execute(query).all()]
            if not rows:
                return
            yield rows
            offset = rows[-1][0] + 1
            if left is not None:
                left -= len(rows)
            if len(rows) < size:
                return

    def all_results(self, job_id: str, with_index: bool = False) -> list[dict[str, Any]]:
        """Every stored result in instance order; `with_index`: each with its `index`."""
        with self.session() as s:
            rows = s.execute(
                select(ResultRow.idx, ResultRow.payload)
                .where(ResultRow.job_id == job_id)
                .order_by(ResultRow.idx)
            ).all()
        if with_index:
            return [{"index": i, **json.loads(p)} for i, p in rows]
        return [json.loads(p) for _, p in rows]

    def delete_all(self) -> None:
        """Testing aid: drop every job and result."""
        with self.session.begin() as s:
            s.query(ResultRow).delete()
            s.query(InputRow).delete()
            s.query(JobRow).delete()


def learned_baseline(store: JobStore | None, model: Model, ref: str) -> Any:
    """The values a succeeded learn-baseline job `ref` learned for this model version (the run
    context's baseline lookup: explainers/context.py)."""
    job = store.get(ref) if store is not None else None
    if store is None or job is None or job.kind != "learn-baseline" or job.model != model.name:
        raise NotFound(
            f"no learned baseline {ref!r} for model {model.name!r}", code="unknown_baseline"
        )
    if job.status != "succeeded":
        raise ApiError(f"baseline job {job.id} is {job.status}", code="baseline_not_ready")
    learned = store.all_results(job.id)[0]
    if learned["model_version"] != model.version:
        raise ApiError(
            f"baseline {job.id} was learned for model version {learned['model_version']}, "
            f"not {model.version}; learn it again",
            code="stale_baseline",
        )
    return learned["baseline"]


__all__ = ["FINISHED", "Job", "JobStore", "Session", "learned_baseline"]
