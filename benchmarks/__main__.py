"""``python -m benchmarks``: see benchmarks/README.md and ``--help``."""

from .runner import main

raise SystemExit(main())
