"""KVzip sampler: the future is the context itself, teacher-forced after a "repeat" instruction.

"KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
https://arxiv.org/abs/2505.23416. The prompt is split into chunks of ``chunk_size`` tokens;
chunk i is reconstructed by feeding, after the full prompt cache (positions n, n+1, ...),

    chunk 0:  instruction            + suffix + chunk 0
    chunk i:  continuation + the last ``overlap`` tokens of chunk i-1 + suffix + chunk i

(the suffix is the chat template's assistant header, "\\n" without a template), as kvpress's
``KVzipPress`` does. Every position of a repeat input is a query. Its softmax covers only the
first ``sink`` prompt keys, the keys of its own chunk and the repeat input's own keys
(causally): the other chunks are not in the normalisation. The chunks' queries form one
pseudo-future whose layers carry that visibility as ``LayerCapture.visible_spans``; the
scorer then computes exactly the chunked softmax (KVzip scores with the max over queries and
over the group's heads: ``attention_mass`` with both reductions ``max``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import torch
from pydantic import Field

from lorekv.samplers.base import (
    SAMPLERS,
    Rollout,
    Sampler,
    SamplerConfig,
    assistant_suffix,
    encode,
    required_tokenizer,
)
from lorekv.trajectories import LayerCapture, Trajectories, cat_optional


class KVzipConfig(SamplerConfig):
    """Config of :class:`KVzipSampler`.

    Attributes:
        instruction: text before the first chunk's repetition (KVzip's and kvpress's).
        continuation: text before a later chunk's repetition, followed by the last
            ``overlap`` tokens of the previous chunk.
        suffix: text between the instruction and the repeated chunk; None (default): the
            tokenizer's chat template's assistant header (the template's text after a user
            message), or "\\n" when the tokenizer has no chat template, as kvpress.
        chunk_size: tokens per reconstructed chunk (>= 1; kvpress 2048, the original 2000).
        overlap: previous-chunk tokens quoted in the continuation (>= 0; 8 as both).
        sink: leading prompt keys in every later chunk's softmax (>= 0; kvpress's n_sink = 4).
        token_stats: compute the repeated tokens' log-probs and entropies (the output head at
            every repeat position). False (default): they are reported as 0, as for the
            ``prompt_window`` pseudo-future: the reconstruction is one pseudo-future, whose weight
            is 1 under every aggregator, so no selection depends on them; True where they are
            read (a ``mixture`` whose aggregator weighs its parts by them).

    The text is tokenized at run time with the tokenizer passed to ``Pipeline.compress`` /
    ``Pipeline.generate`` (``tokenizer=``), so the config itself needs none.
    """

    name: Literal["kvzip"] = "kvzip"
    instruction: str = "\n\nRepeat the previous context exactly."
    continuation: str = "\n\nRepeat the part of the previous context exactly, starting with"
    suffix: str | None = None
    chunk_size: int = Field(default=2048, ge=1, strict=True)
    overlap: int = Field(default=8, ge=0, strict=True)
    sink: int = Field(default=4, ge=0, strict=True)
    token_stats: bool = False


@SAMPLERS.register(KVzipConfig)
class KVzipSampler(Sampler):
    """One pseudo-future: the repeat inputs of every chunk, fed after the prompt, chunked softmax."""

    config: KVzipConfig

    def chunk_ranges(self, n: int) -> list[tuple[int, int]]:
        """The prompt ranges [start, end) whose repeat queries score them, in order: every chunk
        of ``chunk_size`` tokens (the partial sampler, :mod:`lorekv.samplers.partial_kvzip`,
        keeps some of them)."""
        size = self.config.chunk_size
        return [(start, min(start + size, n)) for start in range(0, n, size)]

    def replay_end(self, start: int, end: int) -> int:
        """Where the replay of chunk [start, end) stops: the whole chunk (the strided sampler,
        :mod:`lorekv.samplers.strided_kvzip`, replays its first tokens only)."""
        return end

    def repeat_inputs(self, prompt_ids: torch.Tensor, tokenizer: Any) -> list[tuple[int, int, torch.Tensor]]:
        """(start, end, ids) per chunk of :meth:`chunk_ranges`: the chunk's prompt range
        [start, end) and its (T_i,) repeat input, which replays [start, :meth:`replay_end`)."""
        cfg = self.config
        ids = prompt_ids.reshape(-1).cpu()
        n = ids.shape[0]
        suffix = encode(tokenizer, self.suffix_text(tokenizer))
        first, later = encode(tokenizer, cfg.instruction), encode(tokenizer, cfg.continuation)
        out = []
        for start, end in self.chunk_ranges(n):
            if start == 0:
                prompt = first
            else:
                previous = ids[max(start - cfg.overlap, start - cfg.chunk_size) : start]
                prompt = torch.cat([later, previous])
            out.append((start, end, torch.cat([prompt, suffix, ids[start : self.replay_end(start, end)]])))
        return out

    def suffix_text(self, tokenizer: Any) -> str:
        """The configured suffix, else the chat template's assistant header, else "\\n"
        (:func:`~lorekv.samplers.base.assistant_suffix`)."""
        return assistant_suffix(tokenizer, self.config.suffix)

    def future_positions(self, prompt_ids: torch.Tensor, tokenizer: Any | None) -> int:
        """The longest chunk's repeat input (each chunk is fed at n.., after the whole prompt):
        about ``chunk_size`` plus the instruction, or the whole context when it is shorter."""
        return max(
            ids.shape[0]
            for _, _, ids in self.repeat_inputs(prompt_ids, required_tokenizer(tokenizer, self.config.name))
        )

    def sample(self, rollout: Rollout) -> Trajectories:
        """One pseudo-future (1, sum_i T_i): every chunk's repeat input, queries at positions
        n..n+T_i-1 each, response keys the repeat inputs' own keys, ``visible_spans`` set."""
        tokenizer = required_tokenizer(getattr(rollout, "tokenizer", None), self.config.name)
        n = rollout.prompt_length
        inputs = self.repeat_inputs(rollout.prompt_ids, tokenizer)
        by_length: dict[int, list[int]] = {}
        for i, (_, _, ids) in enumerate(inputs):
            by_length.setdefault(ids.shape[0], []).append(i)
        forced: dict[int, Trajectories] = {}
        for chunks in by_length.values():  # chunks of one length: one pass, as branches of the prompt
            batch = _compact(
                rollout.teacher_force(torch.stack([inputs[i][2] for i in chunks]), stats=self.config.token_stats)
            )
            for row, i in enumerate(chunks):
                forced[i] = _row(batch, row)
        parts = [(start, end, forced[i]) for i, (start, end, _) in enumerate(inputs)]
        # one chunk of the whole prompt: its spans are the causal rule, and without them the
        # scorers read the normaliser of the prompt keys from the pass (LayerCapture.lse)
        whole = len(parts) == 1 and parts[0][:2] == (0, n)
        layers = []
        for i, first in enumerate(parts[0][2].layers):
            per_chunk = [traj.layers[i] for _, _, traj in parts]
            spans, offset = [], 0
            for (start, end, _), layer in zip(parts, per_chunk, strict=True):
                t = layer.queries.shape[2]
                spans.append(chunk_spans(n, start, end, min(self.config.sink, start), offset, t))
                offset += t
            device = first.query_positions.device
            layers.append(
                LayerCapture(
                    layer_idx=first.layer_idx,
                    queries=torch.cat([layer.queries for layer in per_chunk], dim=2),
                    query_positions=torch.cat([layer.query_positions for layer in per_chunk]),
                    prompt_keys=first.prompt_keys,
                    prompt_values=first.prompt_values,
                    response_keys=torch.cat([layer.response_keys for layer in per_chunk], dim=2),
                    response_values=torch.cat([layer.response_values for layer in per_chunk], dim=2),
                    o_proj=first.o_proj,
                    scaling=first.scaling,
                    visible_spans=None if whole else torch.cat(spans).to(device),
                    rotary=first.rotary,
                    query_norms=cat_optional([layer.query_norms for layer in per_chunk], dim=1),
                    lse=cat_optional([layer.lse for layer in per_chunk], dim=2),
                    prompt_features=first.prompt_features,
                )
            )
        trajs = [traj for _, _, traj in parts]
        return Trajectories(
            token_ids=torch.cat([t.token_ids for t in trajs], dim=1),
            logprobs=torch.cat([t.logprobs for t in trajs], dim=1),
            entropies=torch.cat([t.entropies for t in trajs], dim=1),
            layers=tuple(layers),
            prompt_length=n,
        )


def chunk_spans(n: int, start: int, end: int, sink: int, offset: int, length: int) -> torch.Tensor:
    """(length, 3, 2) visible key ranges of one chunk's repeat queries.

    Query t (0-based in the repeat input) sees prompt keys [0, sink) and [start, end), and
    the repeat input's own keys up to itself, which sit at key indices n + offset + [0, t].
    """
    t = torch.arange(length)
    spans = torch.empty(length, 3, 2, dtype=torch.long)
    spans[:, 0, 0], spans[:, 0, 1] = 0, sink
    spans[:, 1, 0], spans[:, 1, 1] = start, end
    spans[:, 2, 0], spans[:, 2, 1] = n + offset, n + offset + t + 1
    return spans


def _row(trajectories: Trajectories, row: int) -> Trajectories:
    """Future ``row`` of ``trajectories`` alone (views)."""
    one = slice(row, row + 1)
    layers = tuple(
        replace(layer, queries=layer.queries[one], response_keys=layer.response_keys[one],
                response_values=layer.response_values[one],
                query_norms=None if layer.query_norms is None else layer.query_norms[one],
                lse=None if layer.lse is None else layer.lse[one])
        for layer in trajectories.layers
    )  # fmt: skip
    return Trajectories(
        trajectories.token_ids[one], trajectories.logprobs[one], trajectories.entropies[one], layers,
        trajectories.prompt_length,
    )  # fmt: skip


def _compact(trajectories: Trajectories) -> Trajectories:
    """The same futures with response keys/values copied out of the futures' cache, so that
    the cache (the whole prompt plus the repeat input) is freed with the rollout's pass."""
    layers = tuple(
        replace(layer, response_keys=layer.response_keys.clone(), response_values=layer.response_values.clone())
        for layer in trajectories.layers
    )
    return Trajectories(
        trajectories.token_ids, trajectories.logprobs, trajectories.entropies, layers, trajectories.prompt_length
    )
