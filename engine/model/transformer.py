"""A Llama-style decoder split across tensor-parallel ranks, with a paged KV cache.

The engine calls `Transformer.forward(batch)`: each entry is (slot, new token ids, start
position; the slot's block table in the cache says where its positions live). Prefill entries
(many tokens) and decode entries (one token) share one call. The linear layers run once over
all tokens of the batch packed together; attention runs per entry (the decodes batched),
which keeps causal masking and per-slot cache reads obviously correct.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from engine.model import blocks, decode_attention, narrow, norm
from engine.model.config import ModelConfig
from engine.model.kvcache import KVCache, Span
from engine.model.norm import RMSNorm
from engine.model.parallel import (
    ColumnParallelLinear,
    ReplicatedEmbedding,
    ReplicatedLinear,
    RowParallelLinear,
    TPContext,
    WeightSource,
)
from engine.model.stages import Part

Entry = tuple[int, Sequence[int], int]
# The layers whose weights may be stored narrower than the arithmetic (see `narrow`).
_WEIGHTS = (ColumnParallelLinear, RowParallelLinear, ReplicatedLinear, ReplicatedEmbedding)


class Rotary(nn.Module):
    """Rotary position embedding with Llama's rotate-half convention (first half / second
    half of each head's dims form the pairs), tables precomputed up to max_seq_len."""

    def __init__(self, head_dim: int, theta: float, max_seq_len: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        )
        freqs = torch.outer(torch.arange(max_seq_len).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def at(self, positions: torch.Tensor, dtype: torch.dtype) -> Angles:
        """The tables at `positions` (tokens,), looked up once per forward for every layer."""
        return Angles(
            self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)
        )


class Decode(NamedTuple):
    """The batch's leading single-token entries (decodes; a step with prompt chunks puts them
    first), attended in one call. By the kernel: its `step` (`decode_attention.Step`), which
    rotates their queries and keys too when they are the whole batch. By torch's path: the
    cache row each one writes, the blocks each reads (B, blocks), and which of those positions
    each may see (B, 1, 1, positions). Planned once per step, for every layer; the entries
    after them are attended one by one."""

    num_entries: int
    step: decode_attention.Step | None
    rows: torch.Tensor
    blocks: torch.Tensor
    mask: torch.Tensor | None

    @classmethod
    def plan(
        cls,
        batch: Sequence[Entry],
        positions: torch.Tensor,
        cache: KVCache,
        kernel: bool,
        angles: Angles | None = None,
    ) -> Decode | None:
        """`positions`: the packed batch's, which for single-token entries are their starts;
        `angles`: at those positions, for the kernel to rotate with. With the kernel, one
        decode is batched too; torch's path attends a lone one without a mask
        (`Attention._attend`), which is cheaper than gathering it."""
        n = 0
        while n < len(batch) and len(batch[n][1]) == 1:
            n += 1
        if n < (1 if kernel else 2):
            return None
        singles = batch[:n]
        starts = [start for _, _, start in singles]
        rows, blocks = cache.decode_rows([slot for slot, _, _ in singles], starts, max(starts) + 1)
        lengths = positions[:n] + 1
        if not kernel:
            mask = decode_attention.visible(blocks, lengths, cache.block_size)
            return cls(n, None, rows, blocks, mask)
        rotate = angles if n == len(batch) else None
        step = decode_attention.Step(rows, blocks, lengths, cache.block_size, rotate)
        return cls(n, step, rows, blocks, None)


class Plan(NamedTuple):
    """Where a step's entries write and read in the cache, for every layer: the batched
    decodes, then one span per entry attended alone."""

    decode: Decode | None
    spans: list[Span]

    @classmethod
    def of(
        cls,
        batch: Sequence[Entry],
        positions: torch.Tensor,
        cache: KVCache,
        kernel: bool,
        angles: Angles | None = None,
    ) -> Plan:
        """`kernel`: decodes attend by `decode_attention.Step` (else torch's path)."""
        decode = Decode.plan(batch, positions, cache, kernel, angles)
        rest = batch[decode.num_entries if decode is not None else 0 :]
        return cls(decode, [cache.span(slot, start, len(ids)) for slot, ids, start in rest])


class Angles(NamedTuple):
    """cos and sin at a batch's positions, shaped (tokens, 1, head_dim) to broadcast."""

    cos: torch.Tensor
    sin: torch.Tensor

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x: (tokens, heads, head_dim)."""
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * self.cos + rotated * self.sin


def head_shards(config: ModelConfig, tp: TPContext) -> tuple[slice, slice]:
    """This rank's (KV heads, query heads): whole KV groups, so no query head is separated
    from the KV head it reads, split unevenly where the count does not divide (9 query and
    3 KV heads at TP=2: rank 0 has KV heads 0-1 and query heads 0-5, rank 1 the rest)."""
    kv = tp.split(config.num_kv_heads, "num_kv_heads")
    group = config.num_heads // config.num_kv_heads
    return kv, slice(kv.start * group, kv.stop * group)


class Attention(nn.Module):
    """Grouped-query attention over this rank's heads; o_proj all-reduces the partial sums."""

    def __init__(self, config: ModelConfig, tp: TPContext, layer: int) -> None:
        super().__init__()
        hd, hidden = config.head_dim, config.hidden_size
        self.layer, self.head_dim = layer, hd
        # Local heads: a contiguous block, so local q head h uses local kv head h // group.
        kv, heads = head_shards(config, tp)
        self.num_heads = heads.stop - heads.start
        self.num_kv_heads = kv.stop - kv.start
        parts = {"q_proj": (heads, hd), "k_proj": (kv, hd), "v_proj": (kv, hd)}
        self.qkv_proj = ColumnParallelLinear(hidden, parts)
        self.o_proj = RowParallelLinear(heads, hidden, tp, hd)

    def forward(self, x: torch.Tensor, angles: Angles, cache: KVCache, plan: Plan) -> torch.Tensor:
        """x: (all tokens of the batch, hidden), packed in entry order."""
        # One (tokens, q + k + v heads, head_dim) output; q and k rotated together.
        heads = self.qkv_proj.stacked(x).view(x.shape[0], -1, self.head_dim)
        rotated = self.num_heads + self.num_kv_heads
        decode = plan.decode
        if decode is not None and decode.step is not None and decode.step.rotates:
            # A decode step on the kernel: it rotates, writes and attends in one call.
            q, k, v = (
                heads[:, : self.num_heads],
                heads[:, self.num_heads : rotated],
                heads[:, rotated:],
            )
            batched = decode.step(q, k, v, cache.layer(self.layer))
            out: torch.Tensor = self.o_proj(batched.reshape(x.shape[0], -1))
            return out
        qk = angles.rotate(heads[:, :rotated])
        q, k, v = qk[:, : self.num_heads], qk[:, self.num_heads :], heads[:, rotated:]
        outputs: list[torch.Tensor] = []
        offset = 0
        if decode is not None:
            offset = decode.num_entries
            batched = self._decode(q[:offset], k[:offset], v[:offset], cache, decode)
            if offset == x.shape[0]:  # a decode step: nothing else to attend
                out = self.o_proj(batched.reshape(offset, -1))
                return out
            outputs.append(batched)
        for span in plan.spans:
            n = span.length
            cache.write(self.layer, span.write, k[offset : offset + n], v[offset : offset + n])
            keys, values = cache.read(self.layer, span.read)
            outputs.append(self._attend(q[offset : offset + n], keys, values, span.start))
            offset += n
        out = self.o_proj(torch.cat(outputs).reshape(x.shape[0], -1))
        return out

    def _decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, decode: Decode
    ) -> torch.Tensor:
        """Every entry one new token, rotated: write them all, then attend them in one call,
        by the kernel over the cache's blocks where they are, or by one masked SDPA over the
        blocks gathered (up to the longest's). (B, heads, dim)."""
        if decode.step is not None:
            out = decode.step(q, k, v, cache.layer(self.layer))
        else:
            assert decode.mask is not None
            keys, values = cache.write_read(self.layer, decode.rows, decode.blocks, k, v)
            out = decode_attention.attend_gathered(q, keys, values, decode.mask)
        return out

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int
    ) -> torch.Tensor:
        """Causal attention of T new queries (at start..start+T) over all cached positions.

        The KV heads are not repeated for their query groups (`enable_gqa`), and the common
        cases need no mask, which keeps SDPA off its slow masked path: one decode token
        attends to everything cached, and a prefill from position 0 is plain causal. Only a
        multi-token entry that continues a sequence builds the offset mask."""
        t = q.shape[0]
        mask = None
        if t > 1 and start > 0:
            q_pos = torch.arange(start, start + t, device=q.device).unsqueeze(1)
            mask = torch.arange(keys.shape[0], device=q.device).unsqueeze(0) <= q_pos
        # 4-D (a batch of one): with 3-D inputs SDPA takes its slow math path on CPU.
        out = nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            keys.transpose(0, 1)[None],
            values.transpose(0, 1)[None],
            attn_mask=mask,
            is_causal=t > 1 and start == 0,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)


class MLP(nn.Module):
    """SwiGLU: gate and up split the intermediate features, down all-reduces them back."""

    def __init__(self, config: ModelConfig, tp: TPContext) -> None:
        super().__init__()
        hidden = config.hidden_size
        features = tp.shard(config.intermediate_size, "intermediate_size")
        self.gate_up_proj = ColumnParallelLinear(
            hidden, {"gate_proj": (features, 1), "up_proj": (features, 1)}
        )
        self.down_proj = RowParallelLinear(features, hidden, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x)
        out: torch.Tensor = self.down_proj(nn.functional.silu(gate) * up)
        return out


class Block(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPContext, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, tp, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, tp)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        angles: Angles,
        cache: KVCache,
        plan: Plan,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's input is x + residual (x alone for the first layer); it returns its
        MLP's output and the residual stream so far, whose sum is its output. Each add is
        fused into the norm after it; the sums are the same as h = x + attn(norm(x)),
        h + mlp(norm(h))."""
        if residual is None:
            residual, normed = x, self.input_layernorm(x)
        else:
            normed, residual = self.input_layernorm.add(x, residual)
        attended = self.self_attn(normed, angles, cache, plan)
        normed, residual = self.post_attention_layernorm.add(attended, residual)
        out: torch.Tensor = self.mlp(normed)
        return out, residual

    def load(self, source: WeightSource, prefix: str) -> None:
        """Module attribute names follow the HF checkpoint, so names map one to one (the
        stacked layers name their parts)."""
        for name in ("input_layernorm", "post_attention_layernorm"):
            getattr(self, name).weight.copy_(source.get(f"{prefix}.{name}.weight"))
        self.self_attn.qkv_proj.load(source, f"{prefix}.self_attn")
        self.self_attn.o_proj.load(source, f"{prefix}.self_attn.o_proj.weight")
        self.mlp.gate_up_proj.load(source, f"{prefix}.mlp")
        self.mlp.down_proj.load(source, f"{prefix}.mlp.down_proj.weight")


class Transformer(nn.Module):
    """The model as one rank sees it, owning that rank's KV cache.

    `part` is what a pipeline stage holds (`engine.model.stages`): a range of layers, with
    or without the embedding and the head; by default the whole model. A part runs its
    pieces through `pack`, `embed`, `run_layers`, `last_tokens` and `head`; `forward` is the
    whole model's step, which is those pieces in order."""

    def __init__(
        self,
        config: ModelConfig,
        tp: TPContext | None = None,
        num_slots: int = 8,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        weight_dtype: torch.dtype | None = None,
        part: Part | None = None,
        num_blocks: int | None = None,
    ) -> None:
        """`num_blocks`: the KV cache's (`KVCache`; None: `num_slots` whole sequences').
        `dtype` is the arithmetic's (activations, norms, KV cache); `weight_dtype` the
        stored matrices' and embedding's (None: the same), see `narrow`; `blocks.BLOCKS` keeps
        the file's quantized blocks (float32 arithmetic only)."""
        super().__init__()
        if weight_dtype == blocks.BLOCKS and dtype != torch.float32:
            raise ValueError(f"dtype: quantized blocks multiply float32 activations, got {dtype}")
        tp = tp or TPContext()
        part = part or Part.whole(config.num_layers)
        self.config, self.tp, self.part = config, tp, part
        # Fail with the field's name up front, before any allocation.
        kv, _ = head_shards(config, tp)
        tp.shard(config.intermediate_size, "intermediate_size")
        device = device or torch.device("cpu")
        # A part without the embedding or the head keeps them empty (nothing allocated).
        vocab = config.vocab_size
        self.embed_tokens = ReplicatedEmbedding(vocab if part.embed else 0, config.hidden_size)
        # Each block indexes the cache by its place in the part (the cache holds its layers).
        self.layers = nn.ModuleList(Block(config, tp, i - part.first) for i in part.layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = ReplicatedLinear(config.hidden_size, vocab if part.head else 0)
        self.dtype = dtype
        # Layers this rank has run: a one-element list, cheaper to bump than an attribute of
        # a Module (see `layers_run`).
        self._ran = [0]
        # Floating weights narrower than the arithmetic can overflow (see forward); blocks
        # are decoded to float32 and cannot.
        self.narrow = (weight_dtype or dtype) not in (dtype, blocks.BLOCKS)
        self._allocate(device, dtype, weight_dtype or dtype)
        # Built after the cast: the rotary tables stay float32, as in transformers.
        self.rotary = Rotary(config.head_dim, config.rope_theta, config.max_seq_len).to(device)
        self.cache = KVCache(
            len(part.layers),
            num_slots,
            config.max_seq_len,
            kv.stop - kv.start,
            config.head_dim,
            device,
            dtype,
            num_blocks=num_blocks,
        )
        # Decodes attend by the C kernel where it builds and the cache is float32; the norms
        # (and the adds before them) likewise.
        self.attention_kernel = decode_attention.available(dtype)
        self.norm_kernel = norm.available(dtype)
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.use("best" if self.norm_kernel else "torch")

    @property
    def layers_run(self) -> int:
        """How many layers this rank has run since it started: it moves inside a step, so a
        node reports it as its `progress` and a step longer than the gateway's
        `stall_timeout` is not taken for a hung collective (which stops it)."""
        return self._ran[0]

    @property
    def device(self) -> torch.device:
        return self.rotary.cos.device

    def use_group(self, tp: TPContext) -> None:
        """All-reduce over `tp`'s group from now on: a pipeline stage's ranks get their
        group once they join the unit, after loading (the shard is the same)."""
        if (tp.rank, tp.world_size) != (self.tp.rank, self.tp.world_size):
            raise ValueError(f"tp: {tp} is another shard than {self.tp}")
        self.tp = tp
        for module in self.modules():
            if isinstance(module, RowParallelLinear):
                module.tp = tp

    def _allocate(self, device: torch.device, dtype: torch.dtype, weights: torch.dtype) -> None:
        """Give every parameter its device and dtype before anything is loaded. The big
        ones (matrices, embedding) are allocated anew rather than converted, so a rank never
        holds its weights twice on the way; the norms keep their initial ones. Blocks get an
        empty placeholder: their bytes per row are the file's to say, at load."""
        for module in self.modules():
            big = isinstance(module, _WEIGHTS)
            for name, param in module.named_parameters(recurse=False):
                if big and weights == blocks.BLOCKS:
                    fresh = torch.empty(0, 0, dtype=weights, device=device)
                elif big:
                    fresh = torch.empty(param.shape, dtype=weights, device=device)
                else:
                    fresh = param.detach().to(device=device, dtype=dtype)
                setattr(module, name, nn.Parameter(fresh, requires_grad=False))

    @torch.inference_mode()
    def load(self, source: WeightSource) -> None:
        """Copy this rank's shard of every weight of its part from `source` (HF names)."""
        part = self.part
        if part.embed:
            self.embed_tokens.load(source, "model.embed_tokens.weight")
        for i, block in zip(part.layers, self.layers, strict=True):
            assert isinstance(block, Block)
            block.load(source, f"model.layers.{i}")
        if not part.head:
            return
        self.norm.weight.copy_(source.get("model.norm.weight"))
        if self.config.tie_embeddings or not source.has("lm_head.weight"):
            # Tied: the head is the embedding's own tensor, not a second vocab x hidden copy.
            self.lm_head.weight = self.embed_tokens.weight
        else:
            self.lm_head.load(source, "lm_head.weight")

    @torch.inference_mode()
    def forward(self, batch: Sequence[Entry]) -> torch.Tensor:
        """Logits (len(batch), vocab) of each entry's last token; writes the entries' keys and
        values into their slots at start_pos onwards. Every rank must call this with the same
        batch, since the row-parallel layers all-reduce inside."""
        ids, positions = self.pack(batch)
        logits = self._logits(batch, ids, positions)
        if self.narrow and not bool(torch.isfinite(logits.sum())):
            # A float16 activation overflowed (see `narrow`). Every rank sees the same
            # logits, so all of them run the step again, rewriting the same cache positions.
            with narrow.widened():
                logits = self._logits(batch, ids, positions)
        return logits

    def _logits(
        self, batch: Sequence[Entry], ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        x = self.run_layers(self.embed(ids), batch, positions)
        return self.head(self.last_tokens(x, batch))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The packed tokens' embeddings, (tokens, hidden) in the arithmetic's dtype."""
        x: torch.Tensor = self.embed_tokens(ids).to(self.dtype)
        return x

    def run_layers(
        self, x: torch.Tensor, batch: Sequence[Entry], positions: torch.Tensor
    ) -> torch.Tensor:
        """The part's layers over the packed batch's hidden states, (tokens, hidden)."""
        angles = self.rotary.at(positions, x.dtype)
        plan = Plan.of(batch, positions, self.cache, self.attention_kernel, angles)
        ran = self._ran
        residual = None
        for block in self.layers:
            x, residual = block(x, residual, angles, self.cache, plan)
            ran[0] += 1
        return x if residual is None else x + residual

    def last_tokens(self, x: torch.Tensor, batch: Sequence[Entry]) -> torch.Tensor:
        """Each entry's last token's row of the packed (tokens, hidden), (entries, hidden)."""
        if x.shape[0] > len(batch):  # some entry has several tokens: keep each one's last
            last = torch.tensor([len(e[1]) for e in batch], device=self.device).cumsum(0) - 1
            x = x[last]
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Float32 logits (entries, vocab) of the last hidden states."""
        logits: torch.Tensor = self.lm_head(self.norm(x))
        return logits.float()

    def pack(self, batch: Sequence[Entry]) -> tuple[torch.Tensor, torch.Tensor]:
        """Validate every entry first (nothing is written on error), then pack tokens."""
        if not batch:
            raise ValueError("batch: must hold at least one entry")
        slots = [slot for slot, _, _ in batch]
        if len(set(slots)) != len(slots):
            raise ValueError(f"batch: a slot appears twice in {slots}")
        flat: list[int] = []
        pos: list[int] = []
        for slot, ids, start in batch:
            if not ids:
                raise ValueError(f"token_ids: entry for slot {slot} is empty")
            if min(ids) < 0 or max(ids) >= self.config.vocab_size:
                raise ValueError(f"token_ids: ids must be in [0, {self.config.vocab_size})")
            self.cache.check(slot, start, len(ids))
            flat.extend(ids)
            pos.extend(range(start, start + len(ids)))
        device = self.device
        return torch.tensor(flat, device=device), torch.tensor(pos, device=device)
