"""python -m app --host 127.0.0.1 --port 8000: run the service (settings from the environment)."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from app.main import create_app
from app.settings import Settings


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level.upper())
    uvicorn.run(create_app(Settings()), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
