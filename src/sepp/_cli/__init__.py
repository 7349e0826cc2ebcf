"""The `sepp-trio` command line (also `python -m sepp`).

Loaded only by those two entry points: `import sepp` never imports this package, argparse or
anything else only the command line needs.
"""

from ._main import main

__all__ = ["main"]
