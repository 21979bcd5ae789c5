"""`python -m core.export` keeps working: the command line is core.cli.export."""

import sys

from core.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
