"""`python -m engine.model.kernels`: build the kernels now. make's set-up runs it, so a missing
compiler shows there rather than at a node's start."""

from engine.model.kernels import OPTIONAL, build, build_optional, library

print(f"{build()} (AVX2 path: {'yes' if library().ug_accelerated() else 'no'})")
for name in OPTIONAL:
    print(build_optional(name))
