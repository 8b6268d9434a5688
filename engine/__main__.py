"""`python -m engine` runs one node of a unit (what `unitgate node` runs)."""

import sys

from engine.cli import main

sys.exit(main())
