"""Jitted autoregressive sampling with a KV cache.

``generate`` runs one compiled program: a prefill of the left-padded prompts
[B, P], then a ``lax.while_loop`` that emits one token per step for all
B * n rows (n samples per prompt; row ``p * n + k`` is sample k of prompt p,
docs/design.md's group layout) and stops when every row has emitted an EOS token or
``max_new_tokens`` is spent. The prompt's KV cache is computed once and copied
to its n samples.

Which distribution the returned log-probs come from (this matters for the
importance ratio, eq. 12-14):

- ``logprobs``: log q(a_t | s_t) of the distribution the token was actually
  drawn from: logits / temperature, then top-k, then top-p (nucleus), then
  renormalised over the kept tokens. This is the exact behaviour policy mu.
  Under greedy decoding q is a point mass and ``logprobs`` is 0.
- ``policy_logprobs``: log softmax(logits / temperature)(a_t), the tempered
  policy with no truncation. This is what a teacher-forced recompute at the same
  temperature gives (``response_logprobs``), i.e. pi_old of eq. 12 when the
  trainer scores responses with the tempered policy.

At temperature 1 with top_k = 0 and top_p = 1 both equal the model's own
log-probs. With truncation, pi(a)/q(a) = Z_kept <= 1 for every sampled token:
using ``policy_logprobs`` as old log-probs ignores that the sampler never
proposes the truncated tail.
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from pgjax.checks import check_finite, require
from pgjax.core import token_logprobs
from pgjax.models.transformer import CausalLM
from pgjax.parallel.mesh import batch_shards, check_divisible_rows, constrain
from pgjax.parallel.multihost import process_rows, to_global


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decoding:
    """How each token is drawn: at most ``max_new_tokens`` tokens, from logits / ``temperature``,
    truncated to the ``top_k`` most likely tokens and the ``top_p`` nucleus (``top_k`` = 0 and
    ``top_p`` = 1 switch truncation off). Shared by ``SamplingConfig`` and a training rollout's
    settings (``rollout.collect.RolloutConfig``), which check them here."""
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    PREFIX: ClassVar[str] = ""         # the settings' keys: PREFIX + field (``rollout.``: ``RolloutConfig``)

    def __post_init__(self):
        key = lambda name: self.PREFIX + name       # noqa: E731
        require(self.max_new_tokens >= 1, key("max_new_tokens"), self.max_new_tokens, "an integer >= 1")
        check_finite(self.temperature > 0, key("temperature"), self.temperature, "> 0 (greedy=True for argmax)")
        require(self.top_k >= 0, key("top_k"), self.top_k, "an integer >= 0 (0: off)")
        require(0 < self.top_p <= 1, key("top_p"), self.top_p, "in (0, 1] (1: off)")

    def decoding(self) -> dict:
        """The ``Decoding`` fields of this config, by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Decoding)}

    def sampling(self, eos_ids, pad_id: int, n: int = 1, greedy: bool = False) -> SamplingConfig:
        """The sampler's settings for these ``Decoding`` fields: ``n`` responses per prompt ending at
        any of ``eos_ids``, padded with ``pad_id``, argmax when ``greedy`` (the one conversion the
        rollouts and the evaluation use)."""
        return SamplingConfig(**self.decoding(), eos_ids=tuple(eos_ids), pad_id=pad_id, n=n, greedy=greedy)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig(Decoding):
    """Static sampling settings (part of the compiled program): the ``Decoding`` fields, and

    ``eos_ids``: tokens that end a response (and are part of it; empty: no row stops before
    ``max_new_tokens``); ``pad_id`` fills the response after it. ``n``: samples per prompt. ``greedy`` takes the argmax.
    ``compaction``: how many times the decode batch may halve, once at most half its rows
    are unfinished (to no fewer than 8 rows; ``stage_sizes``); 0 decodes every row to the end.
    The samples are the same either way; each stage compiles its own decode step.
    """
    eos_ids: tuple[int, ...]
    pad_id: int = 0
    n: int = 1
    greedy: bool = False
    compaction: int = 3

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "eos_ids", tuple(int(i) for i in np.atleast_1d(self.eos_ids)))
        require(self.n >= 1, "n", self.n, "an integer >= 1 (samples per prompt)")
        require(self.compaction >= 0, "compaction", self.compaction, "an integer >= 0 (halvings of the decode batch)")


@flax.struct.dataclass
class Samples:
    """Prompts and sampled responses, row ``p * n + k`` = sample k of prompt p.

    tokens, attention_mask: [R, P + N] prompt (left-padded) then response; the mask
    is 1 on real prompt tokens and on response tokens up to and including EOS.
    response [R, N]; response_mask [R, N] float; logprobs, policy_logprobs [R, N]
    (0 where masked; see the module docstring); lengths [R] int; truncated [R]
    bool: no EOS within ``max_new_tokens``.
    """
    tokens: jax.Array
    attention_mask: jax.Array
    response: jax.Array
    response_mask: jax.Array
    logprobs: jax.Array
    policy_logprobs: jax.Array
    lengths: jax.Array
    truncated: jax.Array

    @property
    def prompt_length(self) -> int:
        return self.tokens.shape[1] - self.response.shape[1]


def sampling_logprobs(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
    """log q over the vocabulary: log softmax(logits / T), truncated to top-k then top-p, renormalised.

    Top-k keeps tokens whose logit is >= the k-th largest; top-p keeps, in
    decreasing probability, each token whose preceding mass is < p (the smallest
    set with mass >= p; ties at the threshold are all kept). Dropped tokens get -inf.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    if top_k and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logp, top_k)[0][..., -1:]
        logp = jax.nn.log_softmax(jnp.where(logp >= kth, logp, -jnp.inf), axis=-1)
    if top_p < 1:
        descending = -jnp.sort(-logp, axis=-1)
        probs = jnp.exp(descending)
        kept = jnp.cumsum(probs, axis=-1) - probs < top_p
        threshold = jnp.min(jnp.where(kept, descending, jnp.inf), axis=-1, keepdims=True)
        logp = jax.nn.log_softmax(jnp.where(logp >= threshold, logp, -jnp.inf), axis=-1)
    return logp


def inverse_cdf_sample(u, logq) -> jax.Array:
    """One draw per row from q = exp(logq) [R, V] given u ~ U(0, 1] [R, 1]: the first token whose
    cumulative mass reaches u q_total. One uniform per row (``jax.random.categorical`` draws V Gumbels
    per row, ~4x slower on CPU at V = 2048); tokens with q = 0 are never drawn."""
    cdf = jnp.cumsum(jnp.exp(logq), axis=-1)
    return jnp.minimum(jnp.sum(cdf < u * cdf[:, -1:], axis=-1), logq.shape[-1] - 1)


def generate(model: CausalLM, prompts, prompt_mask, key, config: SamplingConfig, mesh: Mesh | None = None
             ) -> Samples:
    """Sample ``config.n`` responses to each left-padded prompt; reproducible from ``key``.

    With a ``mesh`` (the model's parameters placed on it, e.g. by ``parallel.mesh.shard``),
    ``prompts`` are this process's rows (``multihost.process_rows``; all of them with one
    process), the batch and the KV cache are split over ``data`` x ``fsdp`` (the cache's KV
    heads over ``tensor``), and the returned arrays are global (``multihost.to_host`` reads
    this process's rows back). The tokens do not depend on the mesh.
    """
    prompts, prompt_mask = _placed_prompts(model, prompts, prompt_mask, config, mesh)
    graphdef, state = nnx.split(model)
    return _generate(graphdef, state, prompts, prompt_mask, key, config, mesh)


def generate_state(graphdef, state, prompts, prompt_mask, key, config: SamplingConfig, mesh: Mesh | None = None
                   ) -> Samples:
    """``generate`` of the model ``nnx.merge(graphdef, state)`` as a function of arrays alone: the
    prompts int32 [B, P], left-padded and already checked (``generate`` checks them). ``jax.vmap``
    maps it over stacked parameters, prompts and keys (``pgjax.train.population``: one program samples
    every member of a population)."""
    return _generate(graphdef, state, prompts, prompt_mask, key, config, mesh)


def _placed_prompts(model: CausalLM, prompts, prompt_mask, config: SamplingConfig, mesh):
    """The prompts checked (``_check_prompts``), as int32, and on a ``mesh`` as global arrays of this
    process's rows (their count split over its batch devices)."""
    prompts, prompt_mask = np.asarray(prompts), np.asarray(prompt_mask)
    _check_prompts(prompts, prompt_mask, model.config.vocab_size, config)
    prompts, prompt_mask = prompts.astype(np.int32), prompt_mask.astype(np.int32)
    if mesh is not None:
        prompts, prompt_mask = to_global((prompts, prompt_mask), mesh)
        check_divisible_rows(prompts.shape[0], mesh, "prompts")
    return prompts, prompt_mask


def _check_prompts(prompts, prompt_mask, vocab_size, config):
    if prompts.ndim != 2 or prompts.shape != prompt_mask.shape:
        raise ValueError(f"prompts and prompt_mask must both be [B, P]; got {prompts.shape} and {prompt_mask.shape}")
    if not np.issubdtype(prompts.dtype, np.integer):
        raise TypeError(f"prompts must be integer token ids, got dtype {prompts.dtype}")
    if not np.isin(prompt_mask, (0, 1)).all():
        raise ValueError("prompt_mask must be 0/1")
    if (prompt_mask[:, -1] == 0).any() or (np.diff(prompt_mask, axis=1) < 0).any():
        raise ValueError("prompts must be left-padded and non-empty: each row's mask is 0...0 1...1 "
                         "and ends in a real token")
    ids = np.concatenate([prompts[prompt_mask > 0], config.eos_ids, [config.pad_id]])
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"token ids (prompts, eos_ids, pad_id) must lie in [0, {vocab_size})")


def _split_batch(tree, mesh):
    """Every array of ``tree`` split along its batch axis (KV caches' keys [B, KV, D, S] and values
    [B, KV, S, D] also along their KV heads)."""
    def one(x):
        if x.ndim == 0:
            return x                                    # a timeline's cursor
        axes = ("batch", "kv_heads", None, None) if x.ndim == 4 else ("batch",) + (None,) * (x.ndim - 1)
        return constrain(x, axes, mesh)
    return jax.tree.map(one, tree)


def stage_sizes(rows: int, halvings: int, mesh: Mesh | None = None, smallest: int = 8) -> tuple[int, ...]:
    """Decode batch sizes: ``rows``, then halved up to ``halvings`` times while the half has at least
    ``smallest`` rows and still splits over the mesh's batch devices."""
    devices = 1 if mesh is None else batch_shards(mesh)
    sizes = [rows]
    while len(sizes) <= halvings and sizes[-1] % 2 == 0 and sizes[-1] // 2 >= max(smallest, devices) \
            and (sizes[-1] // 2) % devices == 0:
        sizes.append(sizes[-1] // 2)
    return tuple(sizes)


@flax.struct.dataclass
class Timeline:
    """A batch's KV cache between the turns of a multi-turn rollout (``start``, ``decode_turn``,
    ``append``): per layer keys [R, KV, D, S] and values [R, KV, S, D] over S slots shared by every row;
    ``key_mask`` [R, S] 1 on the slots holding a row's real tokens (its prompt, what it sampled, what was
    appended to it) and 0 on left padding and on the gaps a row leaves where its turn ended before the others' or its
    appended block is shorter than the longest; ``last`` [R, V]: the logits of each row's next token;
    ``cursor``: the first free slot (int32, the same for every row). Positions are counted over the
    real tokens (``positions_from_mask``), and windows too (``attention_bias``), so a row's gaps change
    nothing it computes: its tokens see what the gap-free sequence would."""
    cache: tuple
    key_mask: jax.Array
    last: jax.Array
    cursor: jax.Array

    if TYPE_CHECKING:       # added by flax.struct.dataclass (dataclasses.replace)
        def replace(self, **changes: Any) -> Timeline: ...

    @property
    def capacity(self) -> int:
        return self.key_mask.shape[1]


@flax.struct.dataclass
class Turn:
    """One turn's samples, as ``Samples``' response fields: response, response_mask, logprobs,
    policy_logprobs [R, N]; lengths [R]; ``ended`` [R]: the row emitted an EOS token this turn."""
    response: jax.Array
    response_mask: jax.Array
    logprobs: jax.Array
    policy_logprobs: jax.Array
    lengths: jax.Array
    ended: jax.Array


@flax.struct.dataclass
class _Live:
    """The decode batch: slot i holds output row ``rows[i]``: its KV cache, key mask, last logits, token
    ``limit`` this turn, ``done`` (an EOS emitted or the limit reached), ``ended`` (an EOS emitted)
    and its ``out`` columns so far (response, mask, logq, logp [S, N])."""
    rows: jax.Array
    cache: tuple
    key_mask: jax.Array
    last: jax.Array
    limit: jax.Array
    done: jax.Array
    ended: jax.Array
    out: tuple

    def keep_alive_first(self, size: int, mesh) -> _Live:
        """The first ``size`` slots after a stable sort that puts unfinished rows first."""
        keep = jnp.argsort(self.done, stable=True)[:size]
        return _split_batch(jax.tree.map(lambda x: x[keep], self), mesh)

    def write_into(self, out: tuple, ended) -> tuple:
        """``out`` [R, N] and ``ended`` [R] with this batch's rows written in."""
        return (tuple(o.at[self.rows].set(x) for o, x in zip(out, self.out, strict=True)),
                ended.at[self.rows].set(self.ended))

    def write_timeline(self, timeline: Timeline, mesh) -> Timeline:
        """``timeline`` with this batch's rows (cache, key mask, last logits) written in."""
        cache = jax.tree.map(lambda full, part: full.at[self.rows].set(part), timeline.cache, self.cache)
        return _split_batch(timeline.replace(cache=cache, key_mask=timeline.key_mask.at[self.rows].set(self.key_mask),
                                             last=timeline.last.at[self.rows].set(self.last)), mesh)


def _prefill(model: CausalLM, prompts, prompt_mask, n: int, capacity: int, mesh) -> Timeline:
    """The timeline after the left-padded prompts [B, P]: one prefill per prompt, its cache copied to
    its ``n`` rows (row p * n + k), ``capacity`` slots, the cursor after the prompts."""
    batch, width = prompts.shape
    key_mask = jnp.concatenate([prompt_mask, jnp.zeros((batch, capacity - width), jnp.int32)], axis=1)
    cache = _split_batch(model.init_cache(batch, capacity), mesh)
    logits, cache = model.decode(prompts, key_mask, cache, 0, last_only=True)
    copies = partial(jnp.repeat, repeats=n, axis=0)
    cache, key_mask, last = _split_batch(jax.tree.map(copies, (cache, key_mask, logits[:, -1])), mesh)
    return Timeline(cache=cache, key_mask=key_mask, last=last, cursor=jnp.asarray(width, jnp.int32))


def _decode(model: CausalLM, timeline: Timeline, key, limits, config: SamplingConfig, mesh,
            keep_timeline: bool) -> tuple[Timeline, Turn]:
    """Decode from the cursor until every row has emitted an EOS or its token limit (``limits`` [R],
    at most ``config.max_new_tokens``; 0: the row sits this turn out), in stages (``stage_sizes``): a
    stage runs until at most the next stage's size of rows are unfinished, which then move to the
    smaller batch (``_Live.keep_alive_first``). Each row draws its uniforms by its own index, so the
    samples do not depend on the stages. ``keep_timeline``: write every row's cache back (a turn
    that is not the last); the cursor moves past the steps run."""
    rows, budget, eos = timeline.key_mask.shape[0], config.max_new_tokens, jnp.asarray(config.eos_ids, jnp.int32)
    truncates = config.top_k > 0 or config.top_p < 1
    cursor = timeline.cursor

    def pick(step, last, slot_rows):
        """The next token, log q(token) and log softmax(logits / T)(token) of each slot."""
        logq = sampling_logprobs(last, config.temperature, config.top_k, config.top_p)
        if config.greedy:
            token = jnp.argmax(last, axis=-1)
        else:
            u = 1.0 - jax.random.uniform(jax.random.fold_in(key, step), (rows, 1))
            token = inverse_cdf_sample(u[slot_rows], logq)
        taken = jnp.take_along_axis(logq, token[:, None], axis=-1)[:, 0]
        logp = token_logprobs(last, token, config.temperature) if truncates else taken
        return token, jnp.zeros_like(taken) if config.greedy else taken, logp

    def body(carry):
        step, live = carry
        token, logq, logp = pick(step, live.last, live.rows)
        alive = ~live.done
        token = jnp.where(alive, token, config.pad_id)
        columns = (token, alive.astype(jnp.float32), jnp.where(alive, logq, 0.0), jnp.where(alive, logp, 0.0))
        out = tuple(o.at[:, step].set(c) for o, c in zip(live.out, columns, strict=True))
        key_mask = jax.lax.dynamic_update_slice_in_dim(live.key_mask, alive[:, None].astype(jnp.int32),
                                                       cursor + step, axis=1)
        logits, cache = model.decode(token[:, None], key_mask, live.cache, cursor + step)
        ended = live.ended | (alive & jnp.isin(token, eos))
        return step + 1, live.replace(cache=_split_batch(cache, mesh), key_mask=key_mask, last=logits[:, -1], out=out,
                                      ended=ended, done=ended | (step + 1 >= live.limit))

    def running_while_more_than(size):
        def cond(carry):
            step, live = carry
            return (step < budget) & (jnp.sum(~live.done) > size)
        return cond

    def empty_out(n):
        return _split_batch((jnp.full((n, budget), config.pad_id, jnp.int32),
                             *(jnp.zeros((n, budget), jnp.float32),) * 3), mesh)

    out, ended = empty_out(rows), jnp.zeros(rows, bool)
    limits = jnp.minimum(jnp.asarray(limits, jnp.int32), budget)
    live = _Live(rows=jnp.arange(rows), cache=timeline.cache, key_mask=timeline.key_mask, last=timeline.last,
                 limit=limits, done=limits <= 0, ended=ended, out=out)
    step = 0
    sizes = stage_sizes(rows, config.compaction, mesh)
    for next_size in (*sizes[1:], 0):
        step, live = jax.lax.while_loop(running_while_more_than(next_size), body, (step, live))
        out, ended = live.write_into(out, ended)
        if keep_timeline:
            timeline = live.write_timeline(timeline, mesh)
        if next_size:
            live = live.keep_alive_first(next_size, mesh)
    response, response_mask, logq, logp = out
    turn = _split_batch(Turn(response=response, response_mask=response_mask, logprobs=logq, policy_logprobs=logp,
                             lengths=response_mask.sum(-1).astype(jnp.int32), ended=ended), mesh)
    return timeline.replace(cursor=cursor + step), turn


@partial(jax.jit, static_argnames=("graphdef", "config", "mesh"))
def _generate(graphdef, state, prompts, prompt_mask, key, config: SamplingConfig, mesh) -> Samples:
    """One compiled program: ``_prefill``, then one ``_decode`` to the budget."""
    model = nnx.merge(graphdef, state)
    model.prepare_decoding()
    width, budget, rows = prompts.shape[1], config.max_new_tokens, prompts.shape[0] * config.n
    timeline = _prefill(model, prompts, prompt_mask, config.n, width + budget, mesh)
    _, turn = _decode(model, timeline, key, jnp.full(rows, budget, jnp.int32), config, mesh, keep_timeline=False)
    copies = partial(jnp.repeat, repeats=config.n, axis=0)
    prompts, prompt_mask = copies(prompts), copies(prompt_mask)
    return _split_batch(Samples(tokens=jnp.concatenate([prompts, turn.response], axis=1),
                   attention_mask=jnp.concatenate([prompt_mask, turn.response_mask.astype(jnp.int32)], axis=1),
                   response=turn.response, response_mask=turn.response_mask, logprobs=turn.logprobs,
                   policy_logprobs=turn.policy_logprobs, lengths=turn.lengths, truncated=~turn.ended), mesh)


def start(model: CausalLM, prompts, prompt_mask, n: int, capacity: int, mesh: Mesh | None = None) -> Timeline:
    """A multi-turn rollout's first timeline: the left-padded ``prompts`` [B, P] prefilled once each,
    copied to their ``n`` rows, in a cache of ``capacity`` slots (the prompt, then every turn's
    tokens and appended blocks, gaps included). Checks the prompts as ``generate`` does."""
    if capacity <= np.shape(prompts)[-1]:
        raise ValueError(f"capacity ({capacity}) must exceed the prompt width ({np.shape(prompts)[-1]})")
    prompts, prompt_mask = _placed_prompts(model, prompts, prompt_mask, SamplingConfig(eos_ids=()), mesh)
    graphdef, state = nnx.split(model)
    return _start(graphdef, state, prompts, prompt_mask, n, capacity, mesh)


@partial(jax.jit, static_argnames=("graphdef", "n", "capacity", "mesh"))
def _start(graphdef, state, prompts, prompt_mask, n, capacity, mesh) -> Timeline:
    model = nnx.merge(graphdef, state)
    model.prepare_decoding()
    return _prefill(model, prompts, prompt_mask, n, capacity, mesh)


def decode_turn(model: CausalLM, timeline: Timeline, key, limits, config: SamplingConfig,
                mesh: Mesh | None = None) -> tuple[Timeline, Turn]:
    """One turn of every row from the timeline's cursor: at most ``limits`` [R] tokens each (0: the
    row sits the turn out; none over ``config.max_new_tokens``), each row stopping at an EOS of
    ``config.eos_ids`` (its end of turn). Returns the timeline past the turn (every row's cache kept)
    and the turn's samples. ``config.n`` is not used: the rows are the timeline's. On a ``mesh``,
    ``limits`` (and ``append``'s blocks) are this process's rows, as ``generate``'s prompts are."""
    if int(timeline.cursor) + config.max_new_tokens > timeline.capacity:
        raise ValueError(f"the timeline has {timeline.capacity - int(timeline.cursor)} free slots, fewer than "
                         f"max_new_tokens = {config.max_new_tokens}: start it with a larger capacity")
    limits = np.asarray(limits, np.int32)
    if mesh is not None:
        limits = to_global(limits, mesh)
    graphdef, state = nnx.split(model)
    return _decode_turn(graphdef, state, timeline, key, limits, config, mesh)


@partial(jax.jit, static_argnames=("graphdef", "config", "mesh"))
def _decode_turn(graphdef, state, timeline, key, limits, config, mesh) -> tuple[Timeline, Turn]:
    model = nnx.merge(graphdef, state)
    model.prepare_decoding()
    return _decode(model, timeline, key, limits, config, mesh, keep_timeline=True)


def append(model: CausalLM, timeline: Timeline, tokens, mask, mesh: Mesh | None = None) -> Timeline:
    """``tokens`` [R, O] written at the cursor, each row's block left-padded (``mask`` [R, O] 0...0
    1...1; a row of zeros appends nothing: its O slots are a gap) and run through the model in one
    pass: the cache holds them and, for each row that got any, ``last`` predicts the token after its
    block. The cursor moves O slots. This is what carries a multi-turn rollout across turns: the
    environment's tokens go in once, never the whole history again."""
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    rows = timeline.key_mask.shape[0]
    if mesh is not None:                    # this process's rows of the timeline's (global) ones
        mine = process_rows(rows, mesh)
        rows = mine.stop - mine.start
    if tokens.shape != mask.shape or tokens.shape[0] != rows:
        raise ValueError(f"tokens and mask must both be [R={rows}, O] (this process's rows); got {tokens.shape} "
                         f"and {mask.shape}")
    if (np.diff(mask, axis=1) < 0).any() or not np.isin(mask, (0, 1)).all():
        raise ValueError("each row's appended block must be left-padded: its mask is 0...0 1...1")
    if int(timeline.cursor) + tokens.shape[1] > timeline.capacity:
        raise ValueError(f"the timeline has {timeline.capacity - int(timeline.cursor)} free slots, fewer than the "
                         f"{tokens.shape[1]} appended: start it with a larger capacity")
    tokens, mask = tokens.astype(np.int32), mask.astype(np.int32)
    if mesh is not None:
        tokens, mask = to_global((tokens, mask), mesh)
    graphdef, state = nnx.split(model)
    return _append(graphdef, state, timeline, tokens, mask, mesh)


@partial(jax.jit, static_argnames=("graphdef", "mesh"))
def _append(graphdef, state, timeline, tokens, mask, mesh) -> Timeline:
    model = nnx.merge(graphdef, state)
    model.prepare_decoding()
    key_mask = jax.lax.dynamic_update_slice_in_dim(timeline.key_mask, mask, timeline.cursor, axis=1)
    logits, cache = model.decode(tokens, key_mask, timeline.cache, timeline.cursor, last_only=True)
    last = jnp.where(mask[:, -1:] > 0, logits[:, -1], timeline.last)
    return _split_batch(Timeline(cache=cache, key_mask=key_mask, last=last, cursor=timeline.cursor + tokens.shape[1]),
                        mesh)
