"""`python -m core.train` and `from core.train import main` keep working: the CLI is core.cli."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
