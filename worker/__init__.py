"""Celery worker that runs job chunks: `python -m worker` (settings from the environment)."""
