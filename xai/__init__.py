"""Python client and CLI of the attribution service."""

from xai.client import AsyncClient, Client
from xai.errors import (
    AuditRowsFailed,
    JobCancelled,
    JobFailed,
    JobTimeout,
    NoExplanations,
    ServiceError,
    Unreachable,
    XaiError,
)
from xai.results import AuditResult, Evaluated, Explained, shap_explanation

__all__ = [
    "AsyncClient",
    "AuditResult",
    "AuditRowsFailed",
    "Client",
    "Evaluated",
    "Explained",
    "JobCancelled",
    "JobFailed",
    "JobTimeout",
    "NoExplanations",
    "ServiceError",
    "Unreachable",
    "XaiError",
    "shap_explanation",
]
