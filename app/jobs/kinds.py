"""The job kinds, one entry each: how a kind is validated at submission, how many results it
stores, how a chunk runs, how the finished job is summarised, and whether it trains (admin
scope, one task whose results are progress records). The routes' `kind` enum, the admin check
and the runner's dispatch all read this table; adding a kind is one entry here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from app.jobs import audit, training
from app.jobs.context import JobContext
from app.jobs.store import Job, JobStore
from app.service import ExplainService
from explainers.registry import EXPLAINERS

if TYPE_CHECKING:
    from app.jobs.routes import JobRequest


@dataclass(frozen=True)
class JobKind:
    name: str
    validate: Callable[[ExplainService, JobRequest, int], dict[str, Any]]  # (.., max_instances)
    total: Callable[[JobRequest], int]  # results the job stores before it succeeds
    run: Callable[[JobContext, Job, list[int]], None]  # one chunk's missing results
    summarise: Callable[[JobStore, Job], dict[str, Any]]
    training: bool = False  # needs the 'admin' scope; runs as one task


def _training(
    name: str,
    validate: Callable[[ExplainService, JobRequest], dict[str, Any]],
    total: Callable[[JobRequest], int],
    run: Callable[[JobContext, Job, list[int]], None],
    summarise: Callable[[JobStore, Job], dict[str, Any]],
) -> JobKind:
    """A training kind: admin scope, one task; `validate` takes no instance limit."""
    return JobKind(name, lambda svc, body, _: validate(svc, body), total, run, summarise, True)


KINDS: tuple[JobKind, ...] = (
    JobKind(
        "audit", audit.validate_audit, audit.audit_total, audit.run_audit, audit.summarise_audit
    ),
    _training(
        "learn-baseline",
        training.validate_learning,
        lambda body: 1,
        training.run_learn_baseline,
        training.summarise_learned,
    ),
    *(  # every trained explainer, from the training its registry line declares
        _training(
            spec.training.job,
            partial(training.validate_training, spec),
            partial(training.training_total, spec),
            partial(training.run_training, spec),
            partial(training.summarise_training, spec),
        )
        for spec in EXPLAINERS
        if spec.training is not None
    ),
)
NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
_BY_NAME = {k.name: k for k in KINDS}
if len(_BY_NAME) != len(KINDS):
    raise ValueError(f"duplicate job kinds in {NAMES}")


def kind(name: str) -> JobKind:
    """The job kind called `name` (KeyError for an unknown one: the routes refuse it first)."""
    return _BY_NAME[name]
