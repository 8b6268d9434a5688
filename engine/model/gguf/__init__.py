"""Llama-architecture GGUF files for the builtin engine: config, sharded weights, tokenizer.

`import gguf` inside this package is the PyPI reader; this package is `engine.model.gguf`.
"""

from engine.model.gguf.config import gguf_config
from engine.model.gguf.file import GGUFFile
from engine.model.gguf.load import load_gguf
from engine.model.gguf.packaged import PACKAGED, gguf_path, is_gguf, packaged_file
from engine.model.gguf.tokenizer import gguf_tokenizer
from engine.model.gguf.weights import GGUFSource

__all__ = [
    "PACKAGED",
    "GGUFFile",
    "GGUFSource",
    "gguf_config",
    "gguf_path",
    "gguf_tokenizer",
    "is_gguf",
    "load_gguf",
    "packaged_file",
]
