"""Optimizers: AdamW with global-norm gradient clipping and a linear warm-up."""
from __future__ import annotations

import dataclasses
import math

import optax


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

    def __post_init__(self):
        rules = [("lr", self.lr > 0, "> 0"), ("warmup_steps", self.warmup_steps >= 0, ">= 0"),
                 ("b1", 0 <= self.b1 < 1, "in [0, 1)"), ("b2", 0 <= self.b2 < 1, "in [0, 1)"),
                 ("eps", self.eps > 0, "> 0"), ("weight_decay", self.weight_decay >= 0, ">= 0"),
                 ("max_grad_norm", self.max_grad_norm >= 0, ">= 0 (0: no clipping)")]
        for name, ok, valid in rules:
            value = getattr(self, name)
            if not (ok and math.isfinite(value)):
                raise ValueError(f"{name} must be finite and {valid}, got {value!r}")


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
    """clip_by_global_norm -> AdamW with the warm-up schedule."""
    schedule = (optax.linear_schedule(0.0, config.lr, config.warmup_steps) if config.warmup_steps
                else optax.constant_schedule(config.lr))
    adamw = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay)
    if not config.max_grad_norm:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)
