"""Python client and CLI of the attribution service."""

from xai.client import AsyncClient, AuditResult, Client, Explained, ServiceError

__all__ = ["AsyncClient", "AuditResult", "Client", "Explained", "ServiceError"]
