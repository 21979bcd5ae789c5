"""`python -m core.eval` evaluates a model: the command line is core.cli.eval."""

import sys

from core.cli.eval import main

if __name__ == "__main__":
    sys.exit(main())
