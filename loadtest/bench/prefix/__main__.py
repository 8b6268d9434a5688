"""`python -m loadtest.bench.prefix`: runs the command line in cli.py."""

import sys

from loadtest.bench.prefix.cli import main

sys.exit(main())
