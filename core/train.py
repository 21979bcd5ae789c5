"""`python -m core.train` and `from core.train import main` keep working: see core.cli.train."""

import sys

from core.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
