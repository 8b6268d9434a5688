"""`python -m loadtest.bench.health`: runs the command line in cli.py."""

import sys

from loadtest.bench.health.cli import main

sys.exit(main())
