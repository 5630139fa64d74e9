"""A decoder-only transformer in Flax NNX covering the Llama 3.x, Qwen2, Qwen3 and Gemma 3 (text) families,
and any other family built of the same layers (a ``Family`` of your own: ``FAMILIES``, ``family_of``).

RMSNorm, rotary position embeddings (with Llama 3's or linear frequency scaling),
grouped-query attention (Qwen2's q/k/v biases, Qwen3's and Gemma 3's q/k RMSNorm), SwiGLU MLP,
tied or untied embeddings. Gemma 3 adds zero-centred norms (x * (1 + w)) on each sublayer's input
and output, a GELU-gated MLP, embeddings scaled by sqrt(hidden_size), a query_pre_attn_scalar
for the attention scale, and sliding-window ("local") layers with their own RoPE base between
the full-attention ("global") ones. Every weight is an ``nnx.Param`` carrying
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
from functools import partial
from typing import ClassVar, Literal

import jax
import jax.numpy as jnp
from flax import nnx

from pgjax.checks import ConfigError, require
from pgjax.errors import described_value
from pgjax.models.lora import Adapter, LoRAConfig, adapter, dropout_keys
from pgjax.parallel.mesh import constrain
from pgjax.plugins import is_import_path, resolve


@dataclasses.dataclass(frozen=True)
class Family:
    """What sets one model family apart: its ``name``; transformers' ``model_type`` (config.json's, what
    ``hf.load`` recognises a checkpoint by) and ``architecture`` (the ``*ForCausalLM`` class ``hf.save``
    names); the switches of ``CausalLM``'s layer: ``qkv_bias`` (biases on the q, k and v projections, as
    Qwen2), ``qk_norm`` (an RMSNorm on each head's queries and keys, as Qwen3 and Gemma 3) and ``gemma``
    (Gemma 3's layer: zero-centred norms, a norm on each sublayer's output too, a GELU-tanh-gated MLP,
    embeddings scaled by sqrt(hidden_size), ``query_pre_attn_scalar``, sliding-window layers with their
    own RoPE base, config.json's ``hidden_activation`` and per-layer-type ``rope_parameters``); every
    other family has Llama's (SiLU MLP, ``hidden_act``, ``rope_theta``). ``extra_config``: entries
    ``hf.save`` adds to config.json (e.g. ``{"sliding_window": None}`` where transformers' config class
    would otherwise default to a window ``CausalLM`` does not implement). A family of your own is named
    by its import path: ``model.family="my_pkg.models:MISTRAL"`` (docs/extending.md)."""
    name: str
    model_type: str
    architecture: str
    qkv_bias: bool = False
    qk_norm: bool = False
    gemma: bool = False
    extra_config: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        if isinstance(self.extra_config, dict):       # given as a dict, kept as sorted pairs (hashable)
            object.__setattr__(self, "extra_config", tuple(sorted(self.extra_config.items())))
        for name in ("name", "model_type", "architecture"):
            if not (isinstance(getattr(self, name), str) and getattr(self, name)):
                raise ValueError(f"Family.{name}={getattr(self, name)!r} is invalid: a non-empty str")


# the built-in families, by the names ModelConfig.family takes (or a Family's import path)
FAMILIES = {"llama": Family("llama", "llama", "LlamaForCausalLM"),
            "qwen2": Family("qwen2", "qwen2", "Qwen2ForCausalLM", qkv_bias=True),
            "qwen3": Family("qwen3", "qwen3", "Qwen3ForCausalLM", qk_norm=True),
            "gemma3": Family("gemma3", "gemma3_text", "Gemma3ForCausalLM", qk_norm=True, gemma=True)}


def family_of(name: str, key: str = "family") -> Family:
    """The ``Family`` that ``name`` names: one of ``FAMILIES``, or the ``Family`` at the import path
    ``package.module:NAME`` (``pgjax.plugins.resolve``); ValueError naming the setting ``key`` otherwise."""
    family = resolve(key, name, FAMILIES, "model family (a pgjax.models.transformer.Family)")
    if not isinstance(family, Family):
        raise ValueError(f"{key}={name!r} is {described_value(family)}, not a pgjax.models.transformer.Family")
    return family

# each layer's attention, named as Hugging Face's ``layer_types``; a layer's index here is its "kind"
LAYER_TYPES = ("full_attention", "sliding_attention")
GEMMA_FIELDS = ("layer_types", "sliding_window", "rope_local_theta", "query_pre_attn_scalar")   # None elsewhere
DTYPES = ("float32", "bfloat16")      # parameter and compute dtypes
# rematerialisation of each layer in a full forward pass (what its backward pass keeps, what it
# recomputes): "off" keeps every activation; "save_matmuls" keeps the 2-D projection and MLP
# products and recomputes the rest (norms, RoPE, attention scores and probabilities, SwiGLU);
# "save_nothing" keeps only each layer's input and recomputes the whole layer
REMAT_POLICIES = {"off": None, "save_matmuls": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                  "save_nothing": jax.checkpoint_policies.nothing_saveable}
# how attention is computed: "einsum", ``grouped_query_attention`` on every backend (XLA fuses it; on a
# CPU it reads the KV cache in place); "blockwise", ``blockwise_attention`` without a cache (training and
# scoring; the KV cache keeps the einsum): the same function over blocks of keys, never holding a row's
# T x S scores; "cudnn", ``fused_attention``: jax.nn.dot_product_attention's cuDNN kernel, for an NVIDIA
# GPU with bfloat16 compute (the same function in float32 terms)
ATTENTION = ("einsum", "blockwise", "cudnn")
ATTENTION_BLOCK = 128     # keys per block of ``blockwise_attention``
# ModelConfig fields that are pgjax's choices for running a checkpoint, not part of its config.json
RUNTIME_OPTIONS = ("param_dtype", "compute_dtype", "remat", "scan_layers", "attention", "lora")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of one checkpoint (names follow Hugging Face's config.json). ``family``: a name of
    ``FAMILIES`` or the import path of a ``Family`` of your own (``family_of``)."""
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
    rope_scaling: tuple | None = None     # sorted (key, value) pairs of HF's rope_scaling (llama3 or linear)
    tie_word_embeddings: bool = False
    # Gemma 3 only (None otherwise): each layer's LAYER_TYPES name (None: every layer full attention); the
    # sliding layers' window (a query sees itself and the sliding_window - 1 slots before it) and RoPE
    # base (rope_theta and rope_scaling are the full layers'); attention scores scaled by
    # query_pre_attn_scalar^(-1/2) instead of head_dim^(-1/2)
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    # the dtype the weight matmuls (the projections and ``logits``) multiply in, accumulating and returning
    # the compute dtype ("": the compute dtype itself): "bfloat16" with float32 compute rounds each input
    # and weight to bfloat16 and sums in float32 (XLA's bfloat16 dot on a CPU with AVX-512 BF16), and the
    # sampler holds every weight in it while decoding (``prepare_decoding``); the sampler's
    # (``rollout.weight_dtype``), not a loading option
    matmul_dtype: str = ""
    remat: str = "off"                    # a key of REMAT_POLICIES
    scan_layers: bool = False             # layers stored stacked and run by one lax.scan (``CausalLM``)
    attention: str = "einsum"             # a name of ATTENTION
    lora: LoRAConfig | None = None        # low-rank adapters on the projections (``pgjax.models.lora``)
    # carried from and back to config.json (None: not set there); the forward pass does not read them
    max_position_embeddings: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None    # a tuple where config.json lists several
    pad_token_id: int | None = None

    PREFIX: ClassVar[str] = "model."        # the settings' keys: model.<field>

    def __post_init__(self):
        """ConfigError ``model.NAME=VALUE is invalid: WHAT IS VALID`` for the first field out of its range
        (``layer_types`` given as a list is kept as a tuple)."""
        if isinstance(self.layer_types, list):
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim")
        sliding = "sliding_attention" in (self.layer_types or ())
        positive = lambda name: getattr(self, name) is None or getattr(self, name) > 0      # noqa: E731
        require(self.family in FAMILIES or is_import_path(self.family), f"{self.PREFIX}family", self.family,
                f"one of {tuple(FAMILIES)}, or the import path package.module:NAME of a Family of your own")
        try:                # an import path: it imports and is a Family
            family = family_of(self.family, f"{self.PREFIX}family")
        except ValueError as error:
            raise ConfigError(str(error), f"{self.PREFIX}family", self.family) from None
        rules = [*((name, lambda name=name: getattr(self, name) >= 1, "an integer >= 1") for name in sizes),
                 ("num_key_value_heads", lambda: self.num_attention_heads % self.num_key_value_heads == 0,
                  f"a divisor of num_attention_heads={self.num_attention_heads}"),
                 ("rms_norm_eps", lambda: self.rms_norm_eps > 0, "> 0"),
                 ("rope_theta", lambda: self.rope_theta > 0, "> 0"),
                 ("param_dtype", lambda: self.param_dtype in DTYPES, f"one of {DTYPES}"),
                 ("compute_dtype", lambda: self.compute_dtype in DTYPES, f"one of {DTYPES}"),
                 ("matmul_dtype", lambda: self.matmul_dtype in ("", *DTYPES), f"one of {DTYPES} or empty"),
                 ("remat", lambda: self.remat in REMAT_POLICIES, f"one of {tuple(REMAT_POLICIES)}"),
                 ("attention", lambda: self.attention in ATTENTION, f"one of {ATTENTION}"),
                 ("attention", lambda: self.attention != "cudnn" or self.compute_dtype == "bfloat16",
                  "einsum with compute_dtype=float32: cuDNN's fused attention takes bfloat16"),
                 *((name, lambda name=name: getattr(self, name) is None or family.gemma,
                    "None unless family='gemma3' (or another Family with gemma=True)") for name in GEMMA_FIELDS),
                 ("layer_types", lambda: self.layer_types is None or (
                     len(self.layer_types) == self.num_hidden_layers and set(self.layer_types) <= set(LAYER_TYPES)),
                  f"num_hidden_layers={self.num_hidden_layers} names, each one of {LAYER_TYPES}"),
                 ("sliding_window", lambda: self.sliding_window is None or self.sliding_window >= 1, "an integer >= 1"),
                 *((name, lambda name=name: not sliding or getattr(self, name) is not None,
                    "set: layer_types has sliding_attention layers")
                   for name in ("sliding_window", "rope_local_theta")),
                 ("rope_local_theta", lambda: positive("rope_local_theta"), "> 0"),
                 ("query_pre_attn_scalar", lambda: positive("query_pre_attn_scalar"), "> 0")]
        for name, ok, valid in rules:
            require(ok(), self.PREFIX + name, getattr(self, name), valid)

    @property
    def family_spec(self) -> Family:
        """The ``Family`` that ``family`` names (``family_of``)."""
        return family_of(self.family)

    @property
    def qkv_bias(self) -> bool:
        return self.family_spec.qkv_bias

    @property
    def qk_norm(self) -> bool:
        return self.family_spec.qk_norm

    @property
    def gemma(self) -> bool:
        """Gemma's layer: zero-centred norms, a norm on each sublayer's output too, GELU-gated MLP,
        embeddings scaled by sqrt(hidden_size)."""
        return self.family_spec.gemma

    @property
    def layer_kinds(self) -> tuple[int, ...]:
        """Each layer's index in ``LAYER_TYPES`` (0, full attention, for every layer without ``layer_types``)."""
        return tuple(LAYER_TYPES.index(t) for t in self.layer_types or ("full_attention",) * self.num_hidden_layers)


def _param(rngs, shape, axes, dtype, scale=0.02):
    return nnx.Param(scale * jax.random.normal(rngs.params(), shape, dtype), logical_axes=axes)


class RMSNorm(nnx.Module):
    """y = x / sqrt(mean(x^2) + eps) * w, normalised in float32, returned in x's dtype.

    ``zero_centred`` (Gemma): y = x / sqrt(mean(x^2) + eps) * (1 + w), w starting at 0, the product
    taken in float32 before the cast (as transformers' Gemma3RMSNorm)."""

    def __init__(self, size: int, eps: float, dtype, zero_centred: bool = False):
        self.weight = nnx.Param((jnp.zeros if zero_centred else jnp.ones)((size,), dtype), logical_axes=("norm",))
        self.eps = eps
        self.zero_centred = zero_centred

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 ** 2, axis=-1, keepdims=True) + self.eps)
        if self.zero_centred:
            return (normed * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)
        return self.weight[...].astype(x.dtype) * normed.astype(x.dtype)


def rope_frequencies(config: ModelConfig, sliding: bool = False) -> jax.Array:
    """Inverse frequencies theta^(-2i/d), scaled as ``rope_scaling`` says (linear: all divided by its
    factor; Llama 3's). ``sliding``: those of Gemma's sliding-window layers (base ``rope_local_theta``,
    never scaled)."""
    d = config.head_dim
    theta = config.rope_local_theta if sliding else config.rope_theta
    if theta is None:
        raise ValueError("sliding-window layers need rope_local_theta")
    inv = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    if sliding or not config.rope_scaling:
        return inv
    s = dict(config.rope_scaling)
    kind = s.get("rope_type", s.get("type"))
    if kind == "linear":
        return inv / s["factor"]
    if kind != "llama3":
        raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: 'linear', 'llama3'")
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
        self.k = _param(rngs, (c.hidden_size, c.num_key_value_heads, c.head_dim), ("embed", "kv_heads", "head_dim"),
                        dtype)
        self.v = _param(rngs, (c.hidden_size, c.num_key_value_heads, c.head_dim), ("embed", "kv_heads", "head_dim"),
                        dtype)
        self.o = _param(rngs, (c.num_attention_heads, c.head_dim, c.hidden_size), ("heads", "head_dim", "embed"), dtype)
        if c.qkv_bias:
            self.q_bias = nnx.Param(jnp.zeros((c.num_attention_heads, c.head_dim), dtype),
                                    logical_axes=("heads", "head_dim"))
            self.k_bias = nnx.Param(jnp.zeros((c.num_key_value_heads, c.head_dim), dtype),
                                    logical_axes=("kv_heads", "head_dim"))
            self.v_bias = nnx.Param(jnp.zeros((c.num_key_value_heads, c.head_dim), dtype),
                                    logical_axes=("kv_heads", "head_dim"))
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype, c.gemma)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dtype, c.gemma)
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        _add_adapters(self, c, rngs, {"q_proj": (c.hidden_size, q, ("embed", "heads")),
                                      "k_proj": (c.hidden_size, kv, ("embed", "kv_heads")),
                                      "v_proj": (c.hidden_size, kv, ("embed", "kv_heads")),
                                      "o_proj": (q, c.hidden_size, ("heads", "embed"))})

    def _project(self, x, rope, dropout_key):
        """Queries [B, T, H, D] and keys, values [B, T, KV, D], with biases, q/k norms and RoPE."""
        c = self.config
        q, k, v = (_project_heads(x, w[...], adapter(self, name), dropout_key, i, c.matmul_dtype)
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
        with ``cache`` = (keys [B, KV, D, S], values [B, KV, S, D]) (``CausalLM.init_cache``)
        the new keys and values are written at their slots first. ``bias`` [B, 1, 1, T, S] is
        ``attention_bias``. Returns the output and the updated (keys, values). ``dropout_key``: the
        adapters' dropout (training).
        """
        q, k, v = self._project(x, rope, dropout_key)
        cached = cache is not None
        v = v.transpose(0, 2, 1, 3)                                             # [B, KV, T, D]
        if cached:                                                              # keys [B, KV, D, S]
            k = jax.lax.dynamic_update_slice_in_dim(cache[0], k.transpose(0, 2, 3, 1).astype(cache[0].dtype),
                                                    index, axis=3)
            v = jax.lax.dynamic_update_slice_in_dim(cache[1], v.astype(cache[1].dtype), index, axis=2)
        else:
            k = k.transpose(0, 2, 1, 3)                                         # [B, KV, T, D]
        if self.config.attention == "cudnn":
            out = fused_attention(q, jnp.swapaxes(k, 2, 3) if cached else k, v, bias, self.config.query_pre_attn_scalar)
        elif self.config.attention == "blockwise" and not cached:
            out = blockwise_attention(q, k, v, bias, self.config.query_pre_attn_scalar)
        else:
            out = grouped_query_attention(q, k, v, bias, self.config.query_pre_attn_scalar, keys_transposed=cached)
        b, t, h, d = out.shape
        out = out.reshape(b, t, h * d)
        projected = _adapted(out, self.o[...].reshape(h * d, -1), adapter(self, "o_proj"), dropout_key, 3,
                             self.config.matmul_dtype)
        return projected, (k, v)


def _matmul(x, w, dtype: str = ""):
    """x [..., D] @ w [D, F] as one 2-D matmul (XLA's CPU backend differentiates 2-D dots far faster
    than the same product written as a batched einsum), in x's dtype; with ``dtype`` (a
    ``ModelConfig.matmul_dtype``) both operands rounded to it and the products summed in x's dtype."""
    rows = x.reshape(-1, x.shape[-1])
    if dtype:
        y = jnp.dot(rows.astype(dtype), w.astype(dtype), preferred_element_type=x.dtype)
    else:
        y = rows @ w.astype(x.dtype)
    return y.reshape(*x.shape[:-1], w.shape[-1])


def _adapted(x, w, lora: Adapter | None, dropout_key, slot: int, dtype: str = ""):
    """x @ w (``_matmul``: in x's dtype, or multiplied in ``dtype``), plus the LoRA update of ``lora``
    when there is one (its dropout drawn from ``dropout_key`` folded with the projection's ``slot``)."""
    y = _matmul(x, w, dtype)
    if lora is None:
        return y
    return y + lora(x, None if dropout_key is None else jax.random.fold_in(dropout_key, slot))


def _project_heads(x, w, lora, dropout_key, slot, dtype: str = ""):
    """x [B, T, D] @ w [D, H, Dh] (+ its adapter; ``_adapted``) -> [B, T, H, Dh]."""
    d, h, dh = w.shape
    return _adapted(x, w.reshape(d, h * dh), lora, dropout_key, slot, dtype).reshape(*x.shape[:-1], h, dh)


def _add_adapters(module: nnx.Module, config: ModelConfig, rngs: nnx.Rngs, shapes: dict) -> None:
    """An ``Adapter`` ``<target>_lora`` on ``module`` for each of ``shapes`` ({target: (d_in, d_out,
    logical axes)}) that ``config.lora`` targets."""
    if config.lora is None:
        return
    for target, (d_in, d_out, axes) in shapes.items():
        if target in config.lora.targets:
            setattr(module, f"{target}_lora", Adapter(d_in, d_out, axes, config.lora,
                                                      jnp.dtype(config.param_dtype), rngs))


def attention_bias(key_mask, positions, index, length: int, window: int | None = None, segments=None) -> jax.Array:
    """0 where query slot i = index + t may see key slot s (s <= i and ``key_mask`` [B, S] set, and
    with a ``window`` position(i) - position(s) < window), the float32 minimum elsewhere:
    [B, 1, 1, length, S], built once per forward. ``positions`` [B, S]: each key slot's position
    (``positions_from_mask``, or ``positions_in_segments`` for packed rows), so a window counts
    tokens, not slots: a cache whose rows have masked gaps between their tokens (a multi-turn
    rollout's timeline, ``pgjax.sample.sampler.Timeline``) windows as the gap-free sequence does.
    ``segments`` [B, S] (packed rows, no cache): s and i must also lie in the same sequence."""
    query_slots = index + jnp.arange(length)
    key_slots = jnp.arange(key_mask.shape[1])
    allowed = (key_slots[None, :] <= query_slots[:, None])[None]
    if window is not None:
        query_positions = jax.lax.dynamic_slice_in_dim(positions, index, length, axis=1)
        allowed = allowed & (query_positions[:, :, None] - positions[:, None, :] < window)
    allowed = allowed & (key_mask[:, None, :] > 0)
    if segments is not None:
        allowed = allowed & (segments[:, :, None] == segments[:, None, :])
    return jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min)[:, None, None]


def grouped_query_attention(q, k, v, bias, query_scale=None, keys_transposed: bool = False):
    """softmax(q k^T / sqrt(s) + bias) v with H query heads sharing each of KV key/value heads;
    s = ``query_scale`` (Gemma's query_pre_attn_scalar), D when None.

    q [B, T, H, D]; k, v [B, KV, S, D] (heads before slots, so each is read as a plain batched
    matmul); ``keys_transposed``: k is [B, KV, D, S], the KV cache's layout (``CausalLM.init_cache``),
    so q k^T is a plain matmul too, where [B, KV, S, D] keys are transposed by the CPU backend at
    every decode step. ``bias`` from ``attention_bias``. Scores and softmax are float32 (float64 for
    float64 inputs).
    """
    b, t, h, d = q.shape
    grouped = _grouped_queries(q, k.shape[1])                                         # [B, KV, G, T, D]
    scale = math.sqrt(d if query_scale is None else query_scale)
    keys = "bkds" if keys_transposed else "bksd"
    scores = jnp.einsum(f"bkgqd,{keys}->bkgqs", grouped, k).astype(_score_dtype(grouped)) / scale + bias
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgqs,bksd->bkgqd", probs, v)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def _grouped_queries(q, kv: int):
    """q [B, T, H, D] as [B, KV, G, T, D]: the G = H / KV query heads of each key/value head."""
    b, t, h, d = q.shape
    return q.reshape(b, t, kv, h // kv, d).transpose(0, 2, 3, 1, 4)


def _key_blocks(k, v, bias, block: int):
    """k, v [B, KV, S, D] and bias [B, 1, 1, T, S] as N = ceil(S / block) blocks along S, stacked first:
    [N, B, KV, block, D] and [N, B, 1, 1, T, block]; the padded slots' bias is -inf (no weight)."""
    s = k.shape[2]
    pad = -s % block
    if pad:
        k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (k, v))
        bias = jnp.pad(bias, ((0, 0),) * 4 + ((0, pad),), constant_values=-jnp.inf)
    blocks = (s + pad) // block
    k, v = (jnp.moveaxis(x.reshape(*x.shape[:2], blocks, block, x.shape[-1]), 2, 0) for x in (k, v))
    bias = jnp.moveaxis(bias.reshape(*bias.shape[:4], blocks, block), 4, 0)
    return k, v, bias


def _score_dtype(x) -> jnp.dtype:
    """The dtype attention scores and softmax are computed in: float32, or x's dtype if wider."""
    return jnp.promote_types(x.dtype, jnp.float32)


def _block_scores(grouped, k_block, bias_block, scale: float):
    """q k^T / sqrt(s) + bias over one block of keys (``_score_dtype``): [B, KV, G, T, block]."""
    return jnp.einsum("bkgqd,bkcd->bkgqc", grouped, k_block).astype(_score_dtype(grouped)) / scale + bias_block


def _blockwise_forward(grouped, k_blocks, v_blocks, bias_blocks, scale: float):
    """The output [B, KV, G, T, D] (``_score_dtype``) and log-sum-exp [B, KV, G, T] of the scores, one block of
    keys at a time with a running maximum m, normaliser l and weighted sum a: for each block,
    m' = max(m, max_c s_c), l' = l e^(m - m') + sum_c e^(s_c - m'), a' = a e^(m - m') + sum_c e^(s_c - m') v_c;
    then output = a / l and log-sum-exp = m + log l."""
    def block(carry, keys):
        top, norm, total = carry
        k_block, v_block, bias_block = keys
        scores = _block_scores(grouped, k_block, bias_block, scale)
        new_top = jnp.maximum(top, scores.max(-1))
        decay, weights = jnp.exp(top - new_top), jnp.exp(scores - new_top[..., None])
        total = total * decay[..., None] + jnp.einsum("bkgqc,bkcd->bkgqd", weights.astype(v_block.dtype), v_block)
        return (new_top, norm * decay + weights.sum(-1), total), None

    shape, dtype = grouped.shape[:-1], _score_dtype(grouped)
    start = (jnp.full(shape, -jnp.inf, dtype), jnp.zeros(shape, dtype), jnp.zeros(grouped.shape, dtype))
    (top, norm, total), _ = jax.lax.scan(block, start, (k_blocks, v_blocks, bias_blocks))
    return total / norm[..., None], top + jnp.log(norm)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def blockwise_attention(q, k, v, bias, query_scale=None, block: int = ATTENTION_BLOCK):
    """``grouped_query_attention`` (q [B, T, H, D]; k, v [B, KV, S, D]; ``bias`` from ``attention_bias``)
    computed over blocks of ``block`` keys (``_blockwise_forward``), so neither pass holds more than one
    block's scores [B, KV, G, T, block]. The backward pass keeps only the output O and the log-sum-exp L
    and recomputes each block's probabilities P = exp(S - L): with dO the output's cotangent and
    Delta = rowsum(dO * O), dV = P^T dO, dP = dO V^T, dS = P * (dP - Delta), dQ = dS K / sqrt(s) and
    dK = dS^T Q / sqrt(s), accumulated block by block. The bias gets no gradient (a mask: None)."""
    return _blockwise_vjp_forward(q, k, v, bias, query_scale, block)[0]


def _blockwise_vjp_forward(q, k, v, bias, query_scale, block):
    b, t, h, d = q.shape
    scale = math.sqrt(d if query_scale is None else query_scale)
    grouped = _grouped_queries(q, k.shape[1])
    out, logsumexp = _blockwise_forward(grouped, *_key_blocks(k, v, bias, block), scale)
    result = out.astype(v.dtype).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)
    return result, (q, k, v, bias, out, logsumexp)


def _blockwise_vjp_backward(query_scale, block, residuals, cotangent):
    q, k, v, bias, out, logsumexp = residuals
    b, t, h, d = q.shape
    kv, s = k.shape[1], k.shape[2]
    scale = math.sqrt(d if query_scale is None else query_scale)
    grouped = _grouped_queries(q, kv)
    dtype = _score_dtype(q)
    d_out = _grouped_queries(cotangent, kv).astype(dtype)
    delta = jnp.sum(d_out * out, -1)                                                    # [B, KV, G, T]

    def one_block(d_grouped, keys):
        k_block, v_block, bias_block = keys
        probs = jnp.exp(_block_scores(grouped, k_block, bias_block, scale) - logsumexp[..., None])
        d_v = jnp.einsum("bkgqc,bkgqd->bkcd", probs, d_out)
        d_scores = probs * (jnp.einsum("bkgqd,bkcd->bkgqc", d_out, v_block.astype(dtype)) - delta[..., None])
        d_grouped = d_grouped + jnp.einsum("bkgqc,bkcd->bkgqd", d_scores, k_block.astype(dtype)) / scale
        d_k = jnp.einsum("bkgqc,bkgqd->bkcd", d_scores, grouped.astype(dtype)) / scale
        return d_grouped, (d_k, d_v)

    d_grouped, (d_k, d_v) = jax.lax.scan(one_block, jnp.zeros(grouped.shape, dtype),
                                         _key_blocks(k, v, bias, block))
    unblocked = lambda x: jnp.moveaxis(x, 0, 2).reshape(b, kv, -1, d)[:, :, :s]       # noqa: E731
    d_q = d_grouped.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)
    return d_q.astype(q.dtype), unblocked(d_k).astype(k.dtype), unblocked(d_v).astype(v.dtype), None  # bias: none


blockwise_attention.defvjp(_blockwise_vjp_forward, _blockwise_vjp_backward)


def fused_attention(q, k, v, bias, query_scale=None, implementation: Literal["cudnn", "xla"] = "cudnn"):
    """``grouped_query_attention`` through ``jax.nn.dot_product_attention``: the same
    softmax(q k^T / sqrt(s) + bias) v, with k, v [B, KV, S, D] read as its [B, S, KV, D] and ``bias``
    [B, 1, 1, T, S] as the boolean mask of its zeros (jax fills the masked scores itself). cuDNN trains
    with a mask only on even lengths, so an odd T or S is padded by one: the padded key is masked
    everywhere, the padded query attends to slot 0 (finite) and is dropped. ``implementation``: ``cudnn``
    (``model.attention=cudnn``: cuDNN's fused kernel, NVIDIA GPUs, bfloat16) or ``xla`` (the same call
    lowered by XLA on any backend: how the tests check it on a CPU). On a CPU the einsum is faster: its KV
    cache needs no transpose."""
    t, s, d = q.shape[1], k.shape[2], q.shape[-1]
    allowed = bias[:, :, 0] == 0                                                    # [B, 1, T, S]
    pad_t, pad_s = t % 2, s % 2
    if pad_t or pad_s:
        q = jnp.pad(q, ((0, 0), (0, pad_t), (0, 0), (0, 0)))
        k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad_s), (0, 0))) for x in (k, v))
        allowed = jnp.pad(allowed, ((0, 0), (0, 0), (0, pad_t), (0, pad_s))).at[:, :, t:, 0].set(True)
    scale = 1.0 / math.sqrt(d if query_scale is None else query_scale)
    out = jax.nn.dot_product_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask=allowed,
                                       scale=scale, implementation=implementation)
    return out[:, :t]


def check_attention_backend(config: "ModelConfig") -> None:
    """ConfigError unless ``model.attention=cudnn`` runs on NVIDIA GPUs (jax's CUDA backend: cuDNN is
    NVIDIA's; an AMD GPU is a "gpu" too, with no cuDNN)."""
    device = jax.devices()[0]
    nvidia = device.platform == "gpu" and "cuda" in device.client.platform_version.lower()
    if config.attention == "cudnn" and not nvidia:
        raise ConfigError(f"model.attention='cudnn' needs an NVIDIA GPU with cuDNN; this process's JAX devices are "
                          f"{device.platform} ({device.device_kind}): use model.attention=einsum there",
                          "model.attention", "cudnn")


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); Gemma's GeGLU: down(gelu(gate(x)) * up(x)) with the tanh
    approximation of GELU (transformers' ``gelu_pytorch_tanh``)."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c, dtype = config, jnp.dtype(config.param_dtype)
        self.gelu, self.matmul_dtype = c.gemma, c.matmul_dtype
        self.gate = _param(rngs, (c.hidden_size, c.intermediate_size), ("embed", "mlp"), dtype)
        self.up = _param(rngs, (c.hidden_size, c.intermediate_size), ("embed", "mlp"), dtype)
        self.down = _param(rngs, (c.intermediate_size, c.hidden_size), ("mlp", "embed"), dtype)
        _add_adapters(self, c, rngs, {"gate_proj": (c.hidden_size, c.intermediate_size, ("embed", "mlp")),
                                      "up_proj": (c.hidden_size, c.intermediate_size, ("embed", "mlp")),
                                      "down_proj": (c.intermediate_size, c.hidden_size, ("mlp", "embed"))})

    def __call__(self, x, dropout_key=None):
        dtype = self.matmul_dtype
        gate = _adapted(x, self.gate[...], adapter(self, "gate_proj"), dropout_key, 4, dtype)
        up = _adapted(x, self.up[...], adapter(self, "up_proj"), dropout_key, 5, dtype)
        act = jax.nn.gelu(gate, approximate=True) if self.gelu else jax.nn.silu(gate)
        return _adapted(act * up, self.down[...], adapter(self, "down_proj"), dropout_key, 6, dtype)


class Block(nnx.Module):
    """Llama / Qwen: h = x + attn(input_norm(x)), out = h + mlp(post_attention_norm(h)).
    Gemma (``sandwich``): h = x + post_attention_norm(attn(input_norm(x))),
    out = h + post_feedforward_norm(mlp(pre_feedforward_norm(h)))."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        dtype = jnp.dtype(config.param_dtype)
        norm = lambda: RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, config.gemma)   # noqa: E731
        self.sandwich = config.gemma
        self.input_norm = norm()
        self.attention = Attention(config, rngs)
        self.post_attention_norm = norm()
        if self.sandwich:
            self.pre_feedforward_norm = norm()
            self.post_feedforward_norm = norm()
        self.mlp = MLP(config, rngs)

    def __call__(self, x, rope, bias, cache=None, index=0, dropout_key=None):
        attended, cache = self.attention(self.input_norm(x), rope, bias, cache, index, dropout_key)
        if self.sandwich:
            x = x + self.post_attention_norm(attended)
            return x + self.post_feedforward_norm(self.mlp(self.pre_feedforward_norm(x), dropout_key)), cache
        x = x + attended
        return x + self.mlp(self.post_attention_norm(x), dropout_key), cache


class CausalLM(nnx.Module):
    """Token ids [B, T] -> final hidden states [B, T, D] or logits [B, T, V]."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        check_attention_backend(config)
        dtype = jnp.dtype(config.param_dtype)
        self.config = config
        self.embed = _param(rngs, (config.vocab_size, config.hidden_size), ("vocab", "embed"), dtype)
        blocks = [Block(config, rngs) for _ in range(config.num_hidden_layers)]
        self.layers = stack_blocks(blocks) if config.scan_layers else nnx.List(blocks)
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, config.gemma)
        if not config.tie_word_embeddings:
            self.lm_head = _param(rngs, (config.hidden_size, config.vocab_size), ("embed", "vocab"), dtype)

    def reconfigured(self, **changes) -> CausalLM:
        """This model's parameters (the same arrays) under its config with ``changes`` that keep every
        parameter's name and shape: another compute or matmul dtype, say (the sampler's model,
        ``rollout.compute_dtype`` and ``rollout.weight_dtype``)."""
        config = dataclasses.replace(self.config, **changes)
        return nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: CausalLM(config, nnx.Rngs(0)))), nnx.state(self))

    def unembedding(self) -> jax.Array:
        """The [D, V] matrix mapping final hidden states to logits (for ``chunked_logprobs_and_entropy``)."""
        return self.embed[...].T if self.config.tie_word_embeddings else self.lm_head[...]

    def __call__(self, tokens, attention_mask=None, *, segment_ids=None, return_hidden: bool = False,
                 dropout_key=None, mesh=None):
        """Logits [B, T, V] (or final hidden states [B, T, D]) of a whole (left-padded) batch;
        ``dropout_key``: draw the LoRA adapters' dropout (training; none without it); ``mesh``:
        keep every layer's activations split over its batch axes (under ``jit`` on that mesh).

        ``segment_ids`` [B, T] instead of ``attention_mask``: packed rows holding several sequences
        each (``pgjax.train.packing``), 0 on padding and k > 0 on the contiguous tokens of a row's
        k-th sequence; a token attends only to earlier tokens of its own sequence and positions
        restart at each sequence's first token, so every sequence's hidden states are those of the
        sequence alone (up to float rounding)."""
        if segment_ids is not None:
            if attention_mask is not None:
                raise ValueError("pass attention_mask or segment_ids, not both")
            hidden, _ = self._hidden(tokens, segment_ids > 0, None, 0, dropout_key, mesh, segment_ids)
            return hidden if return_hidden else self.logits(hidden)
        if attention_mask is None:
            attention_mask = jnp.ones(tokens.shape, jnp.int32)
        hidden, _ = self._hidden(tokens, attention_mask, None, 0, dropout_key, mesh)
        return hidden if return_hidden else self.logits(hidden)

    def logits(self, hidden) -> jax.Array:
        return _matmul(hidden, self.unembedding(), self.config.matmul_dtype)

    def init_cache(self, batch: int, length: int) -> tuple:
        """An empty KV cache in the compute dtype: per layer zero keys [batch, KV, D, length] and values
        [batch, KV, length, D], each laid out so that attention reads it as the second operand of a plain
        matmul (q k^T, then p v; ``grouped_query_attention``)."""
        c = self.config
        keys = jnp.zeros((batch, c.num_key_value_heads, c.head_dim, length), jnp.dtype(c.compute_dtype))
        values = jnp.zeros((batch, c.num_key_value_heads, length, c.head_dim), jnp.dtype(c.compute_dtype))
        return tuple((keys, values) for _ in range(c.num_hidden_layers))

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

    def _hidden(self, tokens, key_mask, cache, index, dropout_key=None, mesh=None, segments=None):
        key_positions = positions_from_mask(key_mask) if segments is None else positions_in_segments(segments)
        positions = jax.lax.dynamic_slice_in_dim(key_positions, index, tokens.shape[1], axis=1)
        c = self.config
        dt = jnp.dtype(c.compute_dtype)
        x = self.embed[...].astype(dt)[tokens]
        if c.gemma:     # the scale rounded to the weights' dtype first, as transformers does (25.25 in bf16)
            x = x * jnp.asarray(math.sqrt(c.hidden_size), self.embed[...].dtype).astype(dt)
        contexts = tuple((rope_tables(positions, rope_frequencies(c, sliding=bool(kind))),
                          attention_bias(key_mask, key_positions, index, tokens.shape[1],
                                         c.sliding_window if kind else None, segments))
                         for kind in range(max(c.layer_kinds) + 1))
        if cache is None:
            return self.final_norm(self._trunk(x, contexts, dropout_key, mesh)), ()
        new_cache = []
        for i, (layer, kind) in enumerate(zip(self.blocks(), c.layer_kinds, strict=True)):
            x, layer_cache = layer(x, *contexts[kind], cache[i], index)
            new_cache.append(layer_cache)
        return self.final_norm(x), tuple(new_cache)

    def _trunk(self, x, contexts, dropout_key, mesh):
        """Every layer on x [B, T, D] without a cache: a ``lax.scan`` over the stacked layers
        (``scan_layers``; one traced layer whatever the depth) or one traced block per layer;
        each under ``jax.checkpoint`` with the ``remat`` policy unless it is "off". ``contexts``:
        the (RoPE tables, attention bias) of each layer kind (``ModelConfig.layer_kinds``); under
        scan with more than one kind, each layer's kind is scanned data that picks its context, so
        the local and global layers are still one traced program. Layer i's adapter dropout (with a
        ``dropout_key``) is drawn from the key folded with i. With a ``mesh`` each layer's input and
        output are constrained to the batch split: without it XLA keeps FSDP's activations whole on
        every device of the ``fsdp`` axis (the parameters' split along ``embed`` pulls them that
        way), holding fsdp times the activation memory."""
        policy = REMAT_POLICIES[self.config.remat]
        keys = dropout_keys(dropout_key, self.config.num_hidden_layers)
        kinds = self.config.layer_kinds

        def layer_output(layer, x, key, context):
            x = constrain(x, ("batch", None, None), mesh)
            return constrain(layer(x, *context, dropout_key=key)[0], ("batch", None, None), mesh)

        if self.config.scan_layers:
            graphdef, stacked = nnx.split(self.layers)
            several = len(contexts) > 1
            choices = jax.tree.map(lambda *c: jnp.stack(c), *contexts) if several else None   # [kinds, ...]

            def body(x, layer):
                layer_state, key, kind = layer
                context = jax.tree.map(lambda c: c[kind], choices) if several else contexts[0]
                return layer_output(nnx.merge(graphdef, layer_state), x, key, context), None

            body = body if policy is None else jax.checkpoint(body, policy=policy)
            return jax.lax.scan(body, x, (stacked, keys, jnp.asarray(kinds) if several else None))[0]
        apply = layer_output if policy is None else nnx.remat(layer_output, policy=policy)
        for i, layer in enumerate(self.layers):
            x = apply(layer, x, None if keys is None else keys[i], contexts[kinds[i]])
        return x

    def blocks(self) -> list[Block]:
        """The layers as L separate ``Block``s (views of layer i of the stacked parameters when
        ``scan_layers``: the KV-cache decode runs them one by one)."""
        if isinstance(self.layers, nnx.List):      # not scan_layers
            return list(self.layers)
        graphdef, stacked = nnx.split(self.layers)
        return [nnx.merge(graphdef, jax.tree.map(lambda v, i=i: v[i], stacked))
                for i in range(self.config.num_hidden_layers)]

    def prepare_decoding(self) -> None:
        """What the sampler does to its traced model before a decode loop: with a ``matmul_dtype``,
        every floating weight rounded to it once (bfloat16 weights: half the bytes each token step
        reads), then the layers held as L separate ``Block``s (``unstack_layers``)."""
        if self.config.matmul_dtype:
            dtype = jnp.dtype(self.config.matmul_dtype)
            weights = nnx.state(self, nnx.Param)
            nnx.update(self, jax.tree.map(lambda w: w.astype(dtype) if jnp.issubdtype(w.dtype, jnp.floating) else w,
                                          weights))
        self.unstack_layers()

    def unstack_layers(self) -> None:
        """Hold the layers as L separate ``Block``s (``blocks()``), the config saying so; nothing changes
        without ``scan_layers``. The sampler calls it on its traced model before the decode loop: the
        rows are then copied out of the stacked weights once per ``generate`` call (one more copy of the
        layers' weights in memory), not read out of them at every token step, which measured slower
        (docs/benchmarks.md, "The model options")."""
        if self.config.scan_layers:
            self.layers = nnx.List(self.blocks())
            self.config = dataclasses.replace(self.config, scan_layers=False)


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


def positions_in_segments(segment_ids) -> jax.Array:
    """Position of each token counted from the first token of its sequence (``segment_ids`` [B, T]:
    contiguous runs of k > 0 per sequence, 0 on padding, where the position is 0)."""
    slots = jnp.arange(segment_ids.shape[-1])
    previous = jnp.pad(segment_ids[..., :-1], ((0, 0), (1, 0)), constant_values=-1)
    first = jax.lax.cummax(jnp.where(segment_ids != previous, slots, 0), axis=segment_ids.ndim - 1)
    return jnp.where(segment_ids > 0, slots - first, 0)
