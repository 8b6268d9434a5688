"""The public API's paths the gateway routes, and which of them each unit kind serves.

A leaf module (no imports) so the registry, the request path and the apps share one table.
The builtin engine (kind "unitgate") serves chat and completions; the vLLM backend's leaders,
a stock vLLM and an OpenAI-compatible server are sent every routed API (one that lacks it
answers 404 itself). Every POST route here takes a JSON body naming its model (or the default
model); `/tokenizer_info` and a stored response's routes (stored.py) take none.
"""

from __future__ import annotations

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
RESPONSES_PATH = "/v1/responses"
MESSAGES_PATH = "/v1/messages"
EMBEDDINGS_PATH = "/v1/embeddings"
TOKENIZER_INFO_PATH = "/tokenizer_info"
# vLLM's other POST routes, each routed like the APIs above (its model from its body).
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"  # Anthropic's: its model is required
TOKENS = ("/tokenize", "/detokenize")
BATCH = ("/v1/chat/completions/batch", "/invocations")  # /invocations: SageMaker's entry
POOLING = (
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/v2/embed",
)
# The APIs whose streams can be resumed token-exactly (proxy/continuation.py).
RESUMABLE = frozenset({CHAT_PATH, COMPLETIONS_PATH})
ROUTED = RESUMABLE | {
    RESPONSES_PATH,
    MESSAGES_PATH,
    EMBEDDINGS_PATH,
    TOKENIZER_INFO_PATH,
    COUNT_TOKENS_PATH,
    *TOKENS,
    *BATCH,
    *POOLING,
}
SERVED_BY_KIND = {"unitgate": RESUMABLE, "vllm": ROUTED, "openai": ROUTED}


def served(kind: str, backend: str) -> frozenset[str]:
    """What a unit answers: a unit of this project's kind run with the vLLM backend serves
    vLLM's own API on its leader, so every routed API."""
    return ROUTED if kind == "unitgate" and backend == "vllm" else SERVED_BY_KIND[kind]
