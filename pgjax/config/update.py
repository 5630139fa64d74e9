"""How the policy is updated from each batch of rollouts: the learner's settings (``UpdateConfig``:
epochs, minibatches, micro-batches, packing) and the optimizer's (``OptimConfig``: AdamW), each a
section of an experiment (``update``; ``optim``, ``critic_optim``, ``warm_start.optim``)."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from jax.sharding import Mesh

from pgjax.checks import check_finite, check_types, require
from pgjax.parallel import mesh as mesh_lib


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    """epochs over each rollout; optimizer steps (minibatches) per epoch; gradient-accumulation
    micro-batches per step; ``temperature`` of the scored policy (the sampling temperature);
    ``value_clip`` of the critic loss (0 = off); ``chunk_size`` of the chunked log-probs;
    ``max_skipped_steps``: consecutive RL steps whose every update was non-finite (and skipped)
    that stop a run; ``recompute_old_logprobs``: compute the old log-probs even when the update
    is on-policy (one epoch of one minibatch, no KL in the reward), where they are skipped
    (``Learner.needs_old_logp``; the same loss and gradient, one forward pass more). What the loss
    does with the sampler's log-probs is the algorithm's (``core.Spec.correction``). ``pack_width``:
    0, or the policy's forward pass in the update packs each micro-batch's sequences into rows
    ``pack_width`` times as wide as the rollout's (``pgjax.train.packing``; the same loss and
    gradient up to float rounding, without computing the rows' padding; the critic's and
    ``prepare``'s passes stay unpacked)."""
    epochs: int = 1
    minibatches: int = 1
    micro_batches: int = 1
    temperature: float = 1.0
    value_clip: float = 0.2
    chunk_size: int = 1024
    max_skipped_steps: int = 3
    recompute_old_logprobs: bool = False
    pack_width: int = 0

    PREFIX: ClassVar[str] = "update."       # the settings' keys: update.<field>

    def __post_init__(self):
        check_types(self, self.PREFIX)
        for name in ("epochs", "minibatches", "micro_batches", "chunk_size", "max_skipped_steps"):
            require(getattr(self, name) >= 1, self.PREFIX + name, getattr(self, name), "an integer >= 1")
        require(self.pack_width >= 0, f"{self.PREFIX}pack_width", self.pack_width,
                "an integer >= 0 (0: no packing; n: rows of n rollout widths)")
        check_finite(self.temperature > 0, f"{self.PREFIX}temperature", self.temperature, "> 0")
        check_finite(self.value_clip >= 0, f"{self.PREFIX}value_clip", self.value_clip, ">= 0 (0: no clipping)")

    def check(self, prompts: int, group_size: int = 1, mesh: Mesh | None = None) -> None:
        """Whole prompt groups per micro-batch; with a ``mesh``, micro-batches of rows that split
        over its ``data`` x ``fsdp`` devices."""
        if prompts % (self.minibatches * self.micro_batches):
            raise ValueError(f"{prompts} prompt groups per step (prompts_per_step) do not split into "
                             f"update.minibatches={self.minibatches} x update.micro_batches={self.micro_batches} "
                             "micro-batches of whole groups")
        if mesh is not None:
            rows = prompts * group_size // (self.minibatches * self.micro_batches)
            mesh_lib.check_divisible_rows(rows, mesh, f"a micro-batch ({prompts} prompts x {group_size} samples / "
                                             f"{self.minibatches} minibatches / {self.micro_batches} micro-batches)")



@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """lr after ``warmup_steps`` of linear warm-up from 0; AdamW (b1, b2, eps, weight_decay);
    gradients clipped to global norm ``max_grad_norm`` (0 disables clipping)."""
    lr: float = 1e-3
    warmup_steps: int = 0
    b1: float = 0.9
    b2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0

    # the settings' keys: PREFIX + field (the section sits at optim, critic_optim and warm_start.optim,
    # so its own messages name it by its type; --set names the key set)
    PREFIX: ClassVar[str] = "OptimConfig."

    def __post_init__(self):
        check_types(self, self.PREFIX)
        rules = [("lr", self.lr > 0, "> 0"), ("b1", 0 <= self.b1 < 1, "in [0, 1)"),
                 ("b2", 0 <= self.b2 < 1, "in [0, 1)"),
                 ("eps", self.eps > 0, "> 0"), ("weight_decay", self.weight_decay >= 0, ">= 0"),
                 ("max_grad_norm", self.max_grad_norm >= 0, ">= 0 (0: no clipping)")]
        for name, ok, valid in rules:
            check_finite(ok, self.PREFIX + name, getattr(self, name), valid)
        require(self.warmup_steps >= 0, f"{self.PREFIX}warmup_steps", self.warmup_steps, "an integer >= 0")
