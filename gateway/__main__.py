"""`python -m gateway` is the `unitgate` command."""

import sys

from gateway.launcher.cli import main

sys.exit(main())
