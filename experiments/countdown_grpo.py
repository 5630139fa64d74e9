"""GRPO (eq. 18) on Countdown: reach the target with the given numbers (each once) and + - * /.

A longer supervised warm start than arithmetic (the expressions are harder to
guess), then GRPO with its KL to the warm-started policy.

    python -m pgjax.run experiments/countdown_grpo.py
"""
from pgjax.config import Experiment, ModelSection, RolloutConfig, TaskSection, WarmStartSection


def experiment() -> Experiment:
    return Experiment(
        name="countdown_grpo", algorithm="grpo", steps=200, prompts_per_step=32,
        task=TaskSection(name="countdown", options={"count": 3}),
        model=ModelSection(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=32),
        rollout=RolloutConfig(samples_per_prompt=8, max_prompt_tokens=14, max_new_tokens=16),
        warm_start=WarmStartSection(steps=400, batch_size=64))
