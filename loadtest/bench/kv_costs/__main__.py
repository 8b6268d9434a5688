"""`python -m loadtest.bench.kv_costs`: runs the command line in cli.py."""

import sys

from loadtest.bench.kv_costs.cli import main

sys.exit(main())
