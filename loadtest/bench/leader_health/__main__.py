"""`python -m loadtest.bench.leader_health`: runs the command line in cli.py."""

import sys

from loadtest.bench.leader_health.cli import main

sys.exit(main())
