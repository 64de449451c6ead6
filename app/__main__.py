"""python -m app --host 127.0.0.1 --port 8000: run the service (settings from the environment)."""

from __future__ import annotations

import argparse

import uvicorn

from app.logging import configure as configure_logging
from app.main import create_app
from app.settings import Settings


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", choices=["json", "text"], default="json")
    args = parser.parse_args()
    configure_logging(args.log_level, args.log_format)
    uvicorn.run(
        create_app(Settings()),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=None,  # keep our handlers (JSON lines with request ids)
    )


if __name__ == "__main__":
    main()
