"""What each unit's KV cache holds, from its engine's own events, and which of it a request's
prompt would reuse: vLLM's wire format read (wire.py), the order of each unit's batches
(order.py), a subscriber per unit on its publisher with replay of what was lost
(subscriber.py), all of them run by the gateway (fleet.py) into one index of cached blocks by
the gateway's own block keys (index.py, keys.py); a request's prompt ids computed as vLLM
computes them (prompts.py), or, without a tokenizer, the ids of a conversation's earlier turn
(turns.py). Routing's scorer for it is gateway/routing/cached.py."""
