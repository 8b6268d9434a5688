"""Lets the load generator run as `python -m loadtest`."""

import sys

from loadtest.gen.cli import main

sys.exit(main())
