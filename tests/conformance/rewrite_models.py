"""`python tests/conformance/rewrite_models.py TESTS_DIR`: vLLM's tests with their model ids
changed to the one model here, and nothing else changed.

vLLM's OpenAI-server tests name the Hugging Face models its CI downloads. No weights are
downloaded here: the tests' dense text models become SmolLM2-135M-Instruct, which the harness
writes into a local Hugging Face cache from the packaged GGUF. Every quoted occurrence of an id
below, in every `.py` file under TESTS_DIR, is replaced by the quoted SmolLM2 id; nothing else
is touched. Models whose tests are about the model itself (gpt-oss's Harmony format, hybrid
Mamba models, multimodal ones, FP8 mixture-of-experts checkpoints) and LoRA adapters are not
rewritten: their tests are reported as not applicable. Running it twice changes nothing more.
"""

from __future__ import annotations

import sys
from pathlib import Path

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
REWRITTEN = (
    "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-1.7B",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen/Qwen2-1.5B-Instruct",
    "facebook/opt-125m",
    "HuggingFaceH4/zephyr-7b-beta",
    "meta-llama/Llama-3.2-1B-Instruct",
    "unsloth/llama-3.2-1b-Instruct",
    "openai-community/gpt2",
)


def rewrite_text(text: str) -> tuple[str, int]:
    """`text` with every quoted id of REWRITTEN replaced, and how many were."""
    count = 0
    for model in REWRITTEN:
        for quote in ('"', "'"):
            old, new = f"{quote}{model}{quote}", f"{quote}{SMOLLM2}{quote}"
            count += text.count(old)
            text = text.replace(old, new)
    return text, count


def rewrite_tree(root: Path) -> dict[str, int]:
    """Rewrite every `.py` file under `root` in place: {relative path: ids replaced}."""
    changed: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        new, count = rewrite_text(text)
        if count:
            path.write_text(new, encoding="utf-8")
            changed[str(path.relative_to(root))] = count
    return changed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    changed = rewrite_tree(Path(args[0]))
    print(f"rewrote {sum(changed.values())} model ids in {len(changed)} files to {SMOLLM2}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
