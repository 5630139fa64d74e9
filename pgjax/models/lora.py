"""LoRA: low-rank adapters on the attention and MLP projections (Hu et al., 2021).

A targeted projection W [d_in, d_out] becomes

    y = x W + (alpha / r) dropout(x) A B,     A [d_in, r], B [r, d_out],

with W frozen, A drawn like PEFT's default (Kaiming-uniform: U(-1/sqrt(d_in), 1/sqrt(d_in))) and
B = 0, so an adapted model starts as its base. ``Adapter`` parameters are ``LoRAParam`` (a subclass
of ``nnx.Param``): the learner differentiates and optimizes only those, and with every adapter
zeroed (``without_adapters``) the model is its base, which is how the KL reference is computed
without a second copy of the weights.

Target names follow Hugging Face / PEFT (``q_proj`` ... ``down_proj``). Export: ``save_peft``
writes a PEFT adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``) that
``peft.PeftModel.from_pretrained`` loads onto the transformers model; ``merged`` folds every
adapter into its weight (W + (alpha/r) A B) for a plain Hugging Face checkpoint (``hf.save``), and
``base`` drops the adapters (the base checkpoint of an adapter trained on a random base).
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from pgjax.checks import check_finite, require

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTENTION_TARGETS + MLP_TARGETS
WEIGHTS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up",
           "down_proj": "down"}        # each target's weight attribute on the Attention / MLP module


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """``rank`` r, ``alpha`` (the update is scaled by alpha / r), ``dropout`` on the adapter's input
    while training, ``targets``: which projections get an adapter (names of ``TARGETS``)."""
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    targets: tuple[str, ...] = TARGETS

    PREFIX: ClassVar[str] = "model.lora."       # the settings' keys: model.lora.<field>

    def __post_init__(self):
        require(self.rank >= 1, f"{self.PREFIX}rank", self.rank, "an integer >= 1")
        check_finite(self.alpha > 0, f"{self.PREFIX}alpha", self.alpha, "> 0")
        require(0 <= self.dropout < 1, f"{self.PREFIX}dropout", self.dropout, "in [0, 1)")
        unknown = sorted(set(self.targets) - set(TARGETS))
        require(bool(self.targets) and not unknown, f"{self.PREFIX}targets", self.targets,
                f"a non-empty subset of {TARGETS}" + (f" ({', '.join(unknown)} unknown)" if unknown else ""))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class LoRAParam(nnx.Param):
    """An adapter matrix: the only parameters a LoRA model trains."""


class Adapter(nnx.Module):
    """x [..., d_in] -> (alpha / r) dropout(x) A B [..., d_out] (see the module docstring)."""

    def __init__(self, d_in: int, d_out: int, axes: tuple, lora: LoRAConfig, dtype, rngs: nnx.Rngs):
        bound = 1.0 / math.sqrt(d_in)
        self.a = LoRAParam(jax.random.uniform(rngs.params(), (d_in, lora.rank), dtype, -bound, bound),
                           logical_axes=(axes[0], None))
        self.b = LoRAParam(jnp.zeros((lora.rank, d_out), dtype), logical_axes=(None, axes[1]))
        self.scale, self.dropout = lora.scale, lora.dropout

    def __call__(self, x, dropout_key=None):
        """The update for x; ``dropout_key`` (training only) drops inputs with the configured rate."""
        if dropout_key is not None and self.dropout > 0:
            keep = jax.random.bernoulli(dropout_key, 1.0 - self.dropout, x.shape)
            x = jnp.where(keep, x / (1.0 - self.dropout), 0).astype(x.dtype)
        low = (x.reshape(-1, x.shape[-1]) @ self.a[...].astype(x.dtype)) @ self.b[...].astype(x.dtype)
        return (self.scale * low).reshape(*x.shape[:-1], -1)


def dropout_keys(key, count: int):
    """``count`` dropout keys (key folded with 0..count-1: one per layer or micro-batch), None
    without a ``key`` (no dropout)."""
    return None if key is None else jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(count))


def adapter(module: nnx.Module, target: str) -> Adapter | None:
    """The ``Adapter`` of projection ``target`` on ``module`` (an Attention or MLP), if it has one."""
    return getattr(module, f"{target}_lora", None)


def split_trainable(state: nnx.State) -> tuple[nnx.State, nnx.State]:
    """(adapters, everything else) of a LoRA model's state."""
    adapters, rest = nnx.split_state(state, LoRAParam, ...)
    return adapters, rest


def without_adapters(state: nnx.State) -> nnx.State:
    """The same state with every adapter zeroed: the base model's function (A B = 0)."""
    adapters, base = split_trainable(state)
    return nnx.merge_state(jax.tree.map(jnp.zeros_like, adapters), base)


def has_adapters(model) -> bool:
    return bool(jax.tree.leaves(nnx.state(model, LoRAParam)))


def initialise_adapters(model) -> None:
    """Give the adapters of an abstract ``model`` (``nnx.eval_shape``; its base weights set from a
    checkpoint) their initial values: those of ``type(model)(model.config, nnx.Rngs(0))``, computed
    under ``jit`` so that only the adapters are materialised."""
    fresh = jax.jit(lambda: nnx.state(type(model)(model.config, nnx.Rngs(0)), LoRAParam))()
    nnx.update(model, fresh)


def merged(model):
    """A copy of the adapted ``model`` without adapters, each folded into its weight:
    W + (alpha / r) A B (reshaped to W's layout), the same function up to rounding."""
    return _plain(model, model.config.lora.scale)


def base(model):
    """A copy of the adapted ``model`` without its adapters: the frozen weights W alone, the base
    model its adapters apply to (a PEFT adapter's base checkpoint, saved with ``hf.save``)."""
    return _plain(model, None)


def _plain(model, scale: float | None):
    """A copy of the adapted ``model`` as a model without LoRA: each adapter folded into its weight
    with ``scale``, or dropped with ``scale`` None."""
    pure = nnx.to_pure_dict(nnx.state(model))
    _merge_into(pure, scale)
    plain = nnx.eval_shape(lambda: type(model)(dataclasses.replace(model.config, lora=None), nnx.Rngs(0)))
    state = nnx.state(plain)
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(nnx.graphdef(plain), state)


def _merge_into(tree: dict, scale: float | None) -> None:
    """Fold (``scale`` None: drop) and remove every ``<target>_lora`` entry of a pure state dict,
    recursively."""
    for target, weight in WEIGHTS.items():
        lora = tree.pop(f"{target}_lora", None)
        if lora is not None and scale is not None:
            w = tree[weight]
            delta = jnp.einsum("...ir,...ro->...io", lora["a"], lora["b"]) * scale
            tree[weight] = w + delta.reshape(w.shape).astype(w.dtype)
    for value in tree.values():
        if isinstance(value, dict):
            _merge_into(value, scale)
