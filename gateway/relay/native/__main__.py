"""`python -m gateway.relay.native`: build the native relay now (set-up), print where it is."""

import sys

from gateway.relay.native import NativeUnavailable, build

try:
    print(build())
except NativeUnavailable as exc:
    print(f"gateway.relay.native: {exc}", file=sys.stderr)
    sys.exit(1)
