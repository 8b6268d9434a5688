"""`python -m engine.model.kernels`: build the kernels now. make's set-up runs it, so a missing
compiler shows there rather than at a node's start."""

from engine.model.kernels import attention_library, build, build_attention, library

blocks_avx2 = library().ug_accelerated()
attention_avx2 = attention_library().ug_attend_accelerated(64)
print(f"{build()} (AVX2 path: {'yes' if blocks_avx2 else 'no'})")
print(f"{build_attention()} (AVX2 path for 64-wide heads: {'yes' if attention_avx2 else 'no'})")
