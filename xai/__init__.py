"""Python client and CLI of the attribution service."""

from xai.client import AsyncClient, Client
from xai.errors import JobTimeout, ServiceError, Unreachable, XaiError
from xai.results import AuditResult, Evaluated, Explained, shap_explanation

__all__ = [
    "AsyncClient",
    "AuditResult",
    "Client",
    "Evaluated",
    "Explained",
    "JobTimeout",
    "ServiceError",
    "Unreachable",
    "XaiError",
    "shap_explanation",
]
