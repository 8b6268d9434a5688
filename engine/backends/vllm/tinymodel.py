"""A tiny Llama checkpoint folder built from code: `python -m engine.backends.vllm.tinymodel DIR`.

Tests and demos need a model vLLM loads by path without a hub download. The folder holds a
random-weight Llama (about 460 thousand parameters), a byte-level BPE tokenizer trained here on
a few lines of text, and a ChatML chat template, so vLLM, transformers and the builtin engine
(`--model DIR`) all read the same files and can be compared token for token.

The shapes are chosen for vLLM's CPU kernels and for TP=2: head_dim 64 is a size its attention
supports and 2 query and 2 KV heads split evenly across two ranks. Weights are float32 with a
wide logit spread so greedy decoding has no near-ties that reduction order could flip between
TP=1 and TP=2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

BOS, EOS, START = "<|endoftext|>", "<|im_end|>", "<|im_start|>"
VOCAB_SIZE = 512
HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, LAYERS = 128, 2, 2, 256, 2
MAX_POSITIONS = 1024
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_CORPUS = """\
A unit is one leader and its followers; the gateway routes each request to a healthy unit.
The quick brown fox jumps over the lazy dog while the scheduler batches tokens in steps.
Hello, world! How are you today? I am fine, thank you. What is the weather like?
Every node answers its health probe; a stalled engine is taken out of routing.
Tensor parallel layers split their weights across ranks and all-reduce the results.
user assistant system hello hi unit tiny model token stream request response cancel.
0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' " the of and to in is it that for
"""


def build_tokenizer() -> object:
    """Byte-level BPE: any text round-trips, and merges make common words single tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, START, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines() * 4, trainer=trainer)
    return tok


def _weights(vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Scaled so activations stay O(1) through the layers and logits are well separated."""
    gen = torch.Generator().manual_seed(seed)
    head_dim = HIDDEN // HEADS

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return torch.normal(0.0, std, size=(rows, cols), generator=gen)

    proj = HIDDEN**-0.5
    tensors = {
        "model.embed_tokens.weight": normal(vocab, HIDDEN, 1.0),
        "model.norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": normal(vocab, HIDDEN, 1.0),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(HIDDEN),
            p + "post_attention_layernorm.weight": torch.ones(HIDDEN),
            p + "self_attn.q_proj.weight": normal(HIDDEN, HIDDEN, proj),
            p + "self_attn.k_proj.weight": normal(KV_HEADS * head_dim, HIDDEN, proj),
            p + "self_attn.v_proj.weight": normal(KV_HEADS * head_dim, HIDDEN, proj),
            p + "self_attn.o_proj.weight": normal(HIDDEN, HIDDEN, proj),
            p + "mlp.gate_proj.weight": normal(INTERMEDIATE, HIDDEN, proj),
            p + "mlp.up_proj.weight": normal(INTERMEDIATE, HIDDEN, proj),
            p + "mlp.down_proj.weight": normal(HIDDEN, INTERMEDIATE, INTERMEDIATE**-0.5),
        }
    return tensors


def _config(vocab: int, bos: int, eos: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }


def write_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Write the checkpoint into `folder` (created if needed) and return it. Deterministic:
    the same seed gives the same files."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.save(str(folder / "tokenizer.json"))  # type: ignore[attr-defined]
    vocab: int = tok.get_vocab_size(with_added_tokens=True)  # type: ignore[attr-defined]
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)  # type: ignore[attr-defined]
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": BOS,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    generation_config = {"bos_token_id": bos, "eos_token_id": eos}
    for name, body in (
        ("config.json", _config(vocab, bos, eos)),
        ("tokenizer_config.json", tokenizer_config),
        ("special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS, "pad_token": BOS}),
        ("generation_config.json", generation_config),
    ):
        (folder / name).write_text(json.dumps(body, indent=2) + "\n")
    save_file(_weights(vocab, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.backends.vllm.tinymodel")
    parser.add_argument("folder", type=Path, help="where to write the checkpoint")
    parser.add_argument("--seed", type=int, default=0, help="weights seed")
    args = parser.parse_args(argv)
    print(write_tiny_model(args.folder, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
