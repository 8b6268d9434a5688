"""`python -m engine.model.export DIR --model smollm2|FILE.gguf`: a Llama GGUF as a Hugging
Face folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with the
chat template, chat_template.jinja, generation_config.json).

Engines that do not read GGUF (vLLM's CPU build for a multi-node unit, transformers without
accelerate) load the folder instead. The weights are the GGUF's dequantized values in float32
and in the HF layout (llama.cpp's q/k rotary permutation undone), read through the same
GGUFSource the builtin engine shards from, so the folder and the file are one model: the
builtin engine gives identical logits from either, and the tokenizer is the engine's own
(tokenizer.json is its `tokenizers` object, pre-tokenizer included).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.model.config import ModelConfig
from engine.model.gguf import GGUFFile, GGUFSource, gguf_config, gguf_path, gguf_tokenizer
from engine.model.tokenizer import TemplatedTokenizer

_LAYER_TENSORS = (
    "input_layernorm",
    "post_attention_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def export(file: GGUFFile, out: Path) -> ModelConfig:
    """Write the folder for `file` into `out` (created; existing files are replaced)."""
    config = gguf_config(file)
    tokenizer = export_tokenizer(file, out, config.max_seq_len)
    weights = out / "model.safetensors"
    save_file(_tensors(file, config), str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors writes 0600; a server may run as another user
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    _write_json(out / "config.json", _hf_config(config, bos, eos))
    generation = {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}
    _write_json(out / "generation_config.json", generation)
    return config


def export_tokenizer(
    file: GGUFFile, out: Path, max_seq_len: int | None = None
) -> TemplatedTokenizer:
    """Only the tokenizer's files (tokenizer.json, tokenizer_config.json, chat_template.jinja):
    what reads prompts but runs no model needs (a gateway keying prompts' blocks)."""
    tokenizer = gguf_tokenizer(file)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.tok.save(str(out / "tokenizer.json"))
    settings: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "model_max_length": max_seq_len or gguf_config(file).max_seq_len,
        "add_bos_token": False,  # the chat template writes what the model expects
        "clean_up_tokenization_spaces": False,
    }
    if tokenizer.template is not None:
        settings["chat_template"] = tokenizer.template
        (out / "chat_template.jinja").write_text(tokenizer.template)
    _write_json(out / "tokenizer_config.json", settings)
    return tokenizer


def _tensors(file: GGUFFile, config: ModelConfig) -> dict[str, torch.Tensor]:
    source = GGUFSource(file, config.head_dim)
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not config.tie_embeddings:
        names.append("lm_head.weight")
    for layer in range(config.num_layers):
        names += [f"model.layers.{layer}.{t}.weight" for t in _LAYER_TENSORS]
    return {name: source.get(name).contiguous() for name in names}


def _hf_config(config: ModelConfig, bos: int | None, eos: int | None) -> dict[str, Any]:
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,  # transformers 4.x and vLLM read it here
        "rope_parameters": rope,  # transformers 5 reads it here
        "tie_word_embeddings": config.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.model.export", description=__doc__)
    p.add_argument("out", type=Path, help="the folder to write")
    p.add_argument("--model", default="smollm2", help="'smollm2' or a Llama .gguf file")
    p.add_argument(
        "--tokenizer-only",
        action="store_true",
        help="only the tokenizer's files: what a gateway reading prompts needs",
    )
    args = p.parse_args(argv)
    try:
        file = GGUFFile(gguf_path(args.model))
        if args.tokenizer_only:
            export_tokenizer(file, args.out)
            print(f"wrote {args.out}: the tokenizer")
            return 0
        config = export(file, args.out)
    except (ValueError, OSError) as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {config.num_layers} layers, vocab {config.vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
