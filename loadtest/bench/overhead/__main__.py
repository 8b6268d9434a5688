"""`python -m loadtest.bench.overhead`: runs the command line in cli.py."""

import sys

from loadtest.bench.overhead.cli import main

sys.exit(main())
