"""A decoder-only transformer in Flax NNX covering the Llama 3.x, Qwen2 and Qwen3 families.

RMSNorm, rotary position embeddings (with Llama 3's frequency scaling),
grouped-query attention (Qwen2's q/k/v biases, Qwen3's q/k RMSNorm), SwiGLU MLP,
tied or untied embeddings. Every weight is an ``nnx.Param`` carrying
``logical_axes`` (``vocab``, ``embed``, ``heads``, ``kv_heads``, ``head_dim``,
``mlp``, ``norm``) for a sharding rule table.

Left-padded batches: ``attention_mask`` [B, T] is 1 on real tokens; positions
are counted from each row's first real token, and padded keys are masked out.
``CausalLM.decode`` runs the same layers against a preallocated KV cache (the
sampler's prefill and decode steps); the full forward is its cache-free case.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from pgjax.models.lora import Adapter, LoRAConfig, adapter, dropout_keys
from pgjax.parallel.mesh import constrain

FAMILIES = ("llama", "qwen2", "qwen3")
DTYPES = ("float32", "bfloat16")      # parameter and compute dtypes
# rematerialisation of each layer in a full forward pass (what its backward pass keeps, what it
# recomputes): "off" keeps every activation; "save_matmuls" keeps the 2-D projection and MLP
# products and recomputes the rest (norms, RoPE, attention scores and probabilities, SwiGLU);
# "save_nothing" keeps only each layer's input and recomputes the whole layer
REMAT_POLICIES = {"off": None, "save_matmuls": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                  "save_nothing": jax.checkpoint_policies.nothing_saveable}
# ModelConfig fields that are pgjax's choices for running a checkpoint, not part of its config.json
RUNTIME_OPTIONS = ("param_dtype", "compute_dtype", "remat", "scan_layers", "lora")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of one checkpoint (names follow Hugging Face's config.json)."""
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None     # Llama 3: sorted (key, value) pairs of HF's rope_scaling dict
    tie_word_embeddings: bool = False
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat: str = "off"                    # a key of REMAT_POLICIES
    scan_layers: bool = False             # layers stored stacked and run by one lax.scan (``CausalLM``)
    lora: LoRAConfig | None = None        # low-rank adapters on the projections (``pgjax.models.lora``)
    # carried from and back to config.json (None: not set there); the forward pass does not read them
    max_position_embeddings: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None    # a tuple where config.json lists several
    pad_token_id: int | None = None

    def __post_init__(self):
        """ValueError ``NAME=VALUE is invalid: WHAT IS VALID`` for the first field out of its range."""
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim")
        rules = [("family", lambda: self.family in FAMILIES, f"one of {FAMILIES}"),
                 *((name, lambda name=name: getattr(self, name) >= 1, "an integer >= 1") for name in sizes),
                 ("num_key_value_heads", lambda: self.num_attention_heads % self.num_key_value_heads == 0,
                  f"a divisor of num_attention_heads={self.num_attention_heads}"),
                 ("rms_norm_eps", lambda: self.rms_norm_eps > 0, "> 0"),
                 ("rope_theta", lambda: self.rope_theta > 0, "> 0"),
                 ("param_dtype", lambda: self.param_dtype in DTYPES, f"one of {DTYPES}"),
                 ("compute_dtype", lambda: self.compute_dtype in DTYPES, f"one of {DTYPES}"),
                 ("remat", lambda: self.remat in REMAT_POLICIES, f"one of {tuple(REMAT_POLICIES)}")]
        for name, ok, valid in rules:
            if not ok():
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: {valid}")

    @property
    def qkv_bias(self) -> bool:
        return self.family == "qwen2"

    @property
    def qk_norm(self) -> bool:
        return self.family == "qwen3"


def _param(rngs, shape, axes, dtype, scale=0.02):
    return nnx.Param(scale * jax.random.normal(rngs.params(), shape, dtype), logical_axes=axes)


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, normalised in float32, returned in x's dtype."""

    def __init__(self, size: int, eps: float, dtype):
        self.weight = nnx.Param(jnp.ones((size,), dtype), logical_axes=("norm",))
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 ** 2, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * normed.astype(x.dtype)


def rope_frequencies(config: ModelConfig) -> jax.Array:
    """Inverse frequencies theta^(-2i/d), with Llama 3's scaling when ``rope_scaling`` says so."""
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    if not config.rope_scaling:
        return inv
    s = dict(config.rope_scaling)
    kind = s.get("rope_type", s.get("type"))
    if kind != "llama3":
        raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: 'llama3'")
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = jnp.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return jnp.where(medium, smoothed, scaled)


def rope_tables(positions, inv_freq):
    """cos and sin of the rotation angles position * theta_i, [B, T, 1, D] each (once per forward)."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq                     # [B, T, D/2]
    angles = jnp.concatenate([angles, angles], -1)[:, :, None, :]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, rope):
    """Rotate-half RoPE on x [B, T, H, D] with the (cos, sin) tables of ``rope_tables``."""
    cos, sin = rope
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c, dtype = config, jnp.dtype(config.param_dtype)
        self.config = c
        self.q = _param(rngs, (c.hidden_size, c.num_attention_heads, c.head_dim), ("embed", "heads", "head_dim"), dtype)
        self.k = _param(rngs, (c.hidden_size, c.num_key_value_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), dtype)
        self.v = _param(rngs, (c.hidden_size, c.num_key_value_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), dtype)
        self.o = _param(rngs, (c.num_attention_heads, c.head_dim, c.hidden_size), ("heads", "head_dim", "embed"), dtype)
        if c.qkv_bias:
            self.q_bias = nnx.Param(jnp.zeros((c.num_attention_heads, c.head_dim), dtype), logical_axes=("heads", "head_dim"))
            self.k_bias = nnx.Param(jnp.zeros((c.num_key_value_heads, c.head_dim), dtype), logical_axes=("kv_heads", "head_dim"))
            self.v_bias = nnx.Param(jnp.zeros((c.num_key_value_heads, c.head_dim), dtype), logical_axes=("kv_heads", "head_dim"))
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype)
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        _add_adapters(self, c, rngs, {"q_proj": (c.hidden_size, q, ("embed", "heads")),
                                      "k_proj": (c.hidden_size, kv, ("embed", "kv_heads")),
                                      "v_proj": (c.hidden_size, kv, ("embed", "kv_heads")),
                                      "o_proj": (q, c.hidden_size, ("heads", "embed"))})

    def _project(self, x, rope, dropout_key):
        """Queries [B, T, H, D] and keys, values [B, T, KV, D], with biases, q/k norms and RoPE."""
        c = self.config
        q, k, v = (_project_heads(x, w[...], adapter(self, name), dropout_key, i)
                   for i, (w, name) in enumerate(((self.q, "q_proj"), (self.k, "k_proj"), (self.v, "v_proj"))))
        if c.qkv_bias:
            dt = x.dtype
            q, k, v = q + self.q_bias[...].astype(dt), k + self.k_bias[...].astype(dt), v + self.v_bias[...].astype(dt)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, rope), apply_rope(k, rope), v

    def __call__(self, x, rope, bias, cache=None, index=0, dropout_key=None):
        """Attend the T new tokens (at slots index..index+T-1) to every allowed key slot.

        Without ``cache`` the keys are the new tokens themselves (index 0, S = T);
        with ``cache`` = (k, v) [B, KV, S, D] the new keys are written at their slots
        first. ``bias`` [B, 1, 1, T, S] is ``attention_bias``. Returns the output and
        the updated (k, v). ``dropout_key``: the adapters' dropout (training).
        """
        q, k, v = self._project(x, rope, dropout_key)
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)              # [B, KV, T, D]
        if cache is not None:
            k = jax.lax.dynamic_update_slice_in_dim(cache[0], k.astype(cache[0].dtype), index, axis=2)
            v = jax.lax.dynamic_update_slice_in_dim(cache[1], v.astype(cache[1].dtype), index, axis=2)
        out = grouped_query_attention(q, k, v, bias)
        b, t, h, d = out.shape
        out = out.reshape(b, t, h * d)
        projected = _adapted(out, self.o[...].reshape(h * d, -1), adapter(self, "o_proj"), dropout_key, 3)
        return projected, (k, v)


def _matmul(x, w):
    """x [..., D] @ w [D, F] as one 2-D matmul (XLA's CPU backend differentiates 2-D dots far faster
    than the same product written as a batched einsum)."""
    return (x.reshape(-1, x.shape[-1]) @ w).reshape(*x.shape[:-1], w.shape[-1])


def _adapted(x, w, lora: Adapter | None, dropout_key, slot: int):
    """x @ w (w [D, F] cast to x's dtype), plus the LoRA update of ``lora`` when there is one (its
    dropout drawn from ``dropout_key`` folded with the projection's ``slot``)."""
    y = _matmul(x, w.astype(x.dtype))
    if lora is None:
        return y
    return y + lora(x, None if dropout_key is None else jax.random.fold_in(dropout_key, slot))


def _project_heads(x, w, lora, dropout_key, slot):
    """x [B, T, D] @ w [D, H, Dh] (+ its adapter) -> [B, T, H, Dh]."""
    d, h, dh = w.shape
    return _adapted(x, w.reshape(d, h * dh), lora, dropout_key, slot).reshape(*x.shape[:-1], h, dh)


def _add_adapters(module: nnx.Module, config: ModelConfig, rngs: nnx.Rngs, shapes: dict) -> None:
    """An ``Adapter`` ``<target>_lora`` on ``module`` for each of ``shapes`` ({target: (d_in, d_out,
    logical axes)}) that ``config.lora`` targets."""
    if config.lora is None:
        return
    for target, (d_in, d_out, axes) in shapes.items():
        if target in config.lora.targets:
            setattr(module, f"{target}_lora", Adapter(d_in, d_out, axes, config.lora,
                                                      jnp.dtype(config.param_dtype), rngs))


def attention_bias(key_mask, index, length: int) -> jax.Array:
    """0 where query slot i = index + t may see key slot s (s <= i and ``key_mask`` [B, S] set),
    the float32 minimum elsewhere: [B, 1, 1, length, S], built once per forward."""
    query_slots = index + jnp.arange(length)
    key_slots = jnp.arange(key_mask.shape[1])
    allowed = (key_slots[None, :] <= query_slots[:, None])[None] & (key_mask[:, None, :] > 0)
    return jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min)[:, None, None]


def grouped_query_attention(q, k, v, bias):
    """softmax(q k^T / sqrt(D) + bias) v with H query heads sharing each of KV key/value heads.

    q [B, T, H, D]; k, v [B, KV, S, D] (heads before slots, so the KV cache is read as
    a plain batched matmul, never transposed); ``bias`` from ``attention_bias``.
    Scores and softmax are float32.
    """
    b, t, h, d = q.shape
    kv = k.shape[1]
    grouped = q.reshape(b, t, kv, h // kv, d).transpose(0, 2, 3, 1, 4)               # [B, KV, G, T, D]
    scores = jnp.einsum("bkgqd,bksd->bkgqs", grouped, k).astype(jnp.float32) / math.sqrt(d) + bias
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgqs,bksd->bkgqd", probs, v)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c, dtype = config, jnp.dtype(config.param_dtype)
        self.gate = _param(rngs, (c.hidden_size, c.intermediate_size), ("embed", "mlp"), dtype)
        self.up = _param(rngs, (c.hidden_size, c.intermediate_size), ("embed", "mlp"), dtype)
        self.down = _param(rngs, (c.intermediate_size, c.hidden_size), ("mlp", "embed"), dtype)
        _add_adapters(self, c, rngs, {"gate_proj": (c.hidden_size, c.intermediate_size, ("embed", "mlp")),
                                      "up_proj": (c.hidden_size, c.intermediate_size, ("embed", "mlp")),
                                      "down_proj": (c.intermediate_size, c.hidden_size, ("mlp", "embed"))})

    def __call__(self, x, dropout_key=None):
        gate = _adapted(x, self.gate[...], adapter(self, "gate_proj"), dropout_key, 4)
        up = _adapted(x, self.up[...], adapter(self, "up_proj"), dropout_key, 5)
        return _adapted(jax.nn.silu(gate) * up, self.down[...], adapter(self, "down_proj"), dropout_key, 6)


class Block(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        dtype = jnp.dtype(config.param_dtype)
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.attention = Attention(config, rngs)
        self.post_attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = MLP(config, rngs)

    def __call__(self, x, rope, bias, cache=None, index=0, dropout_key=None):
        attended, cache = self.attention(self.input_norm(x), rope, bias, cache, index, dropout_key)
        x = x + attended
        return x + self.mlp(self.post_attention_norm(x), dropout_key), cache


class CausalLM(nnx.Module):
    """Token ids [B, T] -> final hidden states [B, T, D] or logits [B, T, V]."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        dtype = jnp.dtype(config.param_dtype)
        self.config = config
        self.embed = _param(rngs, (config.vocab_size, config.hidden_size), ("vocab", "embed"), dtype)
        blocks = [Block(config, rngs) for _ in range(config.num_hidden_layers)]
        self.layers = stack_blocks(blocks) if config.scan_layers else nnx.List(blocks)
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        if not config.tie_word_embeddings:
            self.lm_head = _param(rngs, (config.hidden_size, config.vocab_size), ("embed", "vocab"), dtype)

    def unembedding(self) -> jax.Array:
        """The [D, V] matrix mapping final hidden states to logits (for ``chunked_logprobs_and_entropy``)."""
        return self.embed[...].T if self.config.tie_word_embeddings else self.lm_head[...]

    def __call__(self, tokens, attention_mask=None, *, return_hidden: bool = False, dropout_key=None, mesh=None):
        """Logits [B, T, V] (or final hidden states [B, T, D]) of a whole (left-padded) batch;
        ``dropout_key``: draw the LoRA adapters' dropout (training; none without it); ``mesh``:
        keep every layer's activations split over its batch axes (under ``jit`` on that mesh)."""
        if attention_mask is None:
            attention_mask = jnp.ones(tokens.shape, jnp.int32)
        hidden, _ = self._hidden(tokens, attention_mask, None, 0, dropout_key, mesh)
        return hidden if return_hidden else self.logits(hidden)

    def logits(self, hidden) -> jax.Array:
        return _matmul(hidden, self.unembedding().astype(hidden.dtype))

    def init_cache(self, batch: int, length: int) -> tuple:
        """An empty KV cache: per layer (k, v) zeros [batch, KV, length, D] in the compute dtype."""
        c = self.config
        shape = (batch, c.num_key_value_heads, length, c.head_dim)
        zeros = jnp.zeros(shape, jnp.dtype(c.compute_dtype))
        return tuple((zeros, zeros) for _ in range(c.num_hidden_layers))

    def decode(self, tokens, key_mask, cache, index, *, last_only: bool = False):
        """Logits [B, T, V] of ``tokens`` [B, T] placed at cache slots index..index+T-1, and the new cache.

        ``key_mask`` [B, S] marks the real slots of the whole cache (left padding 0);
        positions are counted from it, so they continue across prefill and decode.
        Equal to the no-cache forward of the concatenated sequence (a test checks).
        ``last_only``: the last token's logits only, [B, 1, V] (a prefill needs no others:
        T x V floats per row not computed).
        """
        hidden, cache = self._hidden(tokens, key_mask, cache, index)
        return self.logits(hidden[:, -1:] if last_only else hidden), cache

    def _hidden(self, tokens, key_mask, cache, index, dropout_key=None, mesh=None):
        positions = jax.lax.dynamic_slice_in_dim(positions_from_mask(key_mask), index, tokens.shape[1], axis=1)
        dt = jnp.dtype(self.config.compute_dtype)
        x = self.embed[...].astype(dt)[tokens]
        rope = rope_tables(positions, rope_frequencies(self.config))
        bias = attention_bias(key_mask, index, tokens.shape[1])
        if cache is None:
            return self.final_norm(self._trunk(x, rope, bias, dropout_key, mesh)), ()
        new_cache = []
        for i, layer in enumerate(self.blocks()):
            x, layer_cache = layer(x, rope, bias, cache[i], index)
            new_cache.append(layer_cache)
        return self.final_norm(x), tuple(new_cache)

    def _trunk(self, x, rope, bias, dropout_key, mesh):
        """Every layer on x [B, T, D] without a cache: a ``lax.scan`` over the stacked layers
        (``scan_layers``; one traced layer whatever the depth) or one traced block per layer;
        each under ``jax.checkpoint`` with the ``remat`` policy unless it is "off". Layer i's
        adapter dropout (with a ``dropout_key``) is drawn from the key folded with i. With a
        ``mesh`` each layer's input and output are constrained to the batch split: without it
        XLA keeps FSDP's activations whole on every device of the ``fsdp`` axis (the parameters'
        split along ``embed`` pulls them that way), holding fsdp times the activation memory."""
        policy = REMAT_POLICIES[self.config.remat]
        keys = dropout_keys(dropout_key, self.config.num_hidden_layers)

        def layer_output(layer, x, key):
            x = constrain(x, ("batch", None, None), mesh)
            return constrain(layer(x, rope, bias, dropout_key=key)[0], ("batch", None, None), mesh)

        if self.config.scan_layers:
            graphdef, stacked = nnx.split(self.layers)

            def body(x, layer):
                layer_state, key = layer
                return layer_output(nnx.merge(graphdef, layer_state), x, key), None

            body = body if policy is None else jax.checkpoint(body, policy=policy)
            return jax.lax.scan(body, x, (stacked, keys))[0]
        apply = layer_output if policy is None else nnx.remat(layer_output, policy=policy)
        for i, layer in enumerate(self.layers):
            x = apply(layer, x, None if keys is None else keys[i])
        return x

    def blocks(self) -> list[Block]:
        """The layers as L separate ``Block``s (views of layer i of the stacked parameters when
        ``scan_layers``: the KV-cache decode runs them one by one)."""
        if not self.config.scan_layers:
            return list(self.layers)
        graphdef, stacked = nnx.split(self.layers)
        return [nnx.merge(graphdef, jax.tree.map(lambda v, i=i: v[i], stacked))
                for i in range(self.config.num_hidden_layers)]


def stack_blocks(blocks: list[Block]) -> Block:
    """One ``Block`` whose every parameter holds the L blocks' stacked along a new leading axis,
    logical axis ``layers`` (replicated by the sharding rules)."""
    graphdef = nnx.graphdef(blocks[0])

    def stacked(*variables):
        axes = variables[0].get_metadata().get("logical_axes", (None,) * variables[0].get_value().ndim)
        return variables[0].replace(jnp.stack([v.get_value() for v in variables]), logical_axes=("layers", *axes))

    is_variable = lambda x: isinstance(x, nnx.Variable)     # noqa: E731
    return nnx.merge(graphdef, jax.tree.map(stacked, *(nnx.state(b) for b in blocks), is_leaf=is_variable))


def positions_from_mask(attention_mask) -> jax.Array:
    """Position of each token counted from its row's first real token (0 on left padding)."""
    return jnp.maximum(jnp.cumsum(attention_mask, axis=-1) - 1, 0)
