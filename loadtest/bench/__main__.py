"""Lets the overhead benchmark run as `python -m loadtest.bench`."""

import sys

from loadtest.bench.cli import main

sys.exit(main())
