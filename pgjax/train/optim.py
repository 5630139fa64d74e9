"""Optimizers: AdamW with global-norm gradient clipping and a linear warm-up."""
from __future__ import annotations

import dataclasses

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
        if not (self.lr > 0 and self.warmup_steps >= 0 and self.max_grad_norm >= 0 and self.weight_decay >= 0
                and 0 <= self.b1 < 1 and 0 <= self.b2 < 1 and self.eps > 0):
            raise ValueError(f"invalid optimizer settings {self}: lr > 0, warmup_steps, max_grad_norm and "
                             "weight_decay >= 0, b1 and b2 in [0, 1), eps > 0")


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
    """clip_by_global_norm -> AdamW with the warm-up schedule."""
    schedule = (optax.linear_schedule(0.0, config.lr, config.warmup_steps) if config.warmup_steps
                else optax.constant_schedule(config.lr))
    adamw = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay)
    if not config.max_grad_norm:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)
