"""`python -m loadtest.bench.engine`: runs the command line in cli.py."""

import sys

from loadtest.bench.engine.cli import main

sys.exit(main())
