"""`python -m loadtest.bench_overhead`: the name `make bench` calls; the code is loadtest.bench."""

import sys

from loadtest.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
