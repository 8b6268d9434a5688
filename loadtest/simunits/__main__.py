"""Lets the simulated units test tool run as `python -m loadtest.simunits`."""

import sys

from loadtest.simunits.cli import main

sys.exit(main())
