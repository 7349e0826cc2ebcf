"""`python -m sepp`: the `sepp-trio` command line."""

from ._cli import main

raise SystemExit(main())
