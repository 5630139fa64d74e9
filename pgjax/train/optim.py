"""Optimizers: AdamW with global-norm gradient clipping and a linear warm-up."""
from __future__ import annotations

import optax

from pgjax.config.update import OptimConfig


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
    """clip_by_global_norm -> AdamW with the warm-up schedule."""
    schedule = (optax.linear_schedule(0.0, config.lr, config.warmup_steps) if config.warmup_steps
                else optax.constant_schedule(config.lr))
    adamw = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay)
    if not config.max_grad_norm:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)
