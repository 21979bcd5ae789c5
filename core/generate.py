"""`python -m core.generate` keeps working: the command line is core.cli.generate."""

import sys

from core.cli.generate import main

if __name__ == "__main__":
    sys.exit(main())
