"""`python -m core.monitor` forwards to core.cli.monitor, as core/train.py does for training."""

import sys

from core.cli.monitor import main

if __name__ == "__main__":
    sys.exit(main())
