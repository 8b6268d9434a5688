"""`python -m gateway` is the `unitgate` command."""

import sys

from gateway.cli import main

sys.exit(main())
