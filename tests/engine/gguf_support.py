"""Tiny Llama GGUF files written in tests, laid out as llama.cpp's converter writes them:
Q/K rows permuted for its rotary kernel, matrices quantized, norms F32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

Q4_1, Q8_0, F32 = GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0, GGMLQuantizationType.F32
SHAPE = {"hidden": 96, "heads": 6, "kv_heads": 3, "ffn": 192, "vocab": 64, "layers": 2}


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (HF -> GGUF)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def hf_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under Hugging Face names and in HF layout, float32."""
    rng = np.random.default_rng(seed)
    hidden, ffn, kv = SHAPE["hidden"], SHAPE["ffn"], SHAPE["kv_heads"] * 16
    shapes = {
        "model.embed_tokens.weight": (SHAPE["vocab"], hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(SHAPE["layers"]):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": (hidden,),
            f"{p}.post_attention_layernorm.weight": (hidden,),
            f"{p}.self_attn.q_proj.weight": (hidden, hidden),
            f"{p}.self_attn.k_proj.weight": (kv, hidden),
            f"{p}.self_attn.v_proj.weight": (kv, hidden),
            f"{p}.self_attn.o_proj.weight": (hidden, hidden),
            f"{p}.mlp.gate_proj.weight": (ffn, hidden),
            f"{p}.mlp.up_proj.weight": (ffn, hidden),
            f"{p}.mlp.down_proj.weight": (hidden, ffn),
        }
    return {n: rng.normal(0, 0.5, s).astype(np.float32) for n, s in shapes.items()}


GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def stored_type(name: str) -> GGMLQuantizationType:
    if name.endswith("norm.weight"):
        return F32
    return Q8_0 if "embed" in name else Q4_1


def roundtrip(name: str, w: np.ndarray) -> np.ndarray:
    """What the file holds for HF tensor `name`, decoded: quantization's loss, HF layout.
    Quantizing rows commutes with permuting them, so this is the loader's exact target."""
    kind = stored_type(name)
    return w if kind == F32 else dequantize(quantize(w, kind), kind)


def write_gguf(
    path: Path, weights: dict[str, np.ndarray], architecture: str = "llama", **extra: int
) -> Path:
    """A Llama GGUF of `weights` (HF names and layout); `extra` adds uint32 llama.* keys."""
    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(SHAPE["layers"])
    writer.add_context_length(32)
    writer.add_embedding_length(SHAPE["hidden"])
    writer.add_feed_forward_length(SHAPE["ffn"])
    writer.add_head_count(SHAPE["heads"])
    writer.add_head_count_kv(SHAPE["kv_heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    for key, value in extra.items():
        writer.add_uint32(f"{architecture}.{key}", value)
    _add_tokenizer(writer)
    for name, w in weights.items():
        if name.startswith("model.layers."):
            _, _, layer, module = name.removesuffix(".weight").split(".", 3)
            target = f"blk.{layer}.{GGUF_NAMES[module]}.weight"
        else:
            target = {"model.embed_tokens.weight": "token_embd.weight"}.get(
                name, "output_norm.weight"
            )
        stored = w
        if name.endswith("q_proj.weight"):
            stored = permute(w, SHAPE["heads"])
        elif name.endswith("k_proj.weight"):
            stored = permute(w, SHAPE["kv_heads"])
        kind = stored_type(name)
        if kind == F32:
            writer.add_tensor(target, stored)
        else:
            writer.add_tensor(target, quantize(stored, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
MERGED = LETTERS[:23]
TOKENS = [*SPECIALS, "Ġ", "Ċ", *LETTERS, *"0123456789", *(f"Ġ{c}" for c in MERGED)]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _add_tokenizer(writer: GGUFWriter) -> None:
    """A byte-level BPE over lowercase letters, digits, space and newline: 64 ids, with
    'Ġa'..'Ġw' merged."""
    assert len(TOKENS) == SHAPE["vocab"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    writer.add_token_merges([f"Ġ {c}" for c in MERGED])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)
