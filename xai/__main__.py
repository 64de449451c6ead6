"""python -m xai: the command line."""

from xai.cli import main

raise SystemExit(main())
