"""Dr. GRPO on a real checkpoint and a math dataset, for a GPU or TPU host.

Point it at a local Hugging Face checkpoint directory (Qwen2.5 / Qwen3 / Llama 3,
with its tokenizer) and a GSM8K / MATH style JSONL file; nothing is downloaded:

    python -m pgjax.run experiments/math_checkpoint.py \\
        --set model.path=/models/Qwen2.5-0.5B-Instruct --set task.options.path=/data/gsm8k_train.jsonl

The dataset may also be parquet, arrow or CSV (``task.options.file_format``, the
``data`` extra), and its prompts chat messages (``--set task.options.prompt_field=messages``;
docs/training.md, "Your own data").

Prompts are the dataset's ``question`` field, put through the checkpoint's chat
template when it has one (put any "put the final answer in \\boxed{}"
instruction into the file, or into ``task.prompt.system_prompt``); answers are
compared by ``pgjax.tasks.math_reward`` (final ``\\boxed{}`` / ``####`` / last
number, numerically and symbolically), plus 0.1 x the format reward for a
``\\boxed{}`` answer. No supervised warm start: the checkpoint is the start.
"""
from pgjax.config import (
    Experiment,
    ModelSection,
    OptimConfig,
    RewardSection,
    RolloutConfig,
    TaskSection,
    UpdateConfig,
    WarmStartSection,
)


def experiment() -> Experiment:
    return Experiment(
        name="math_checkpoint",
        algorithm="dr_grpo",
        steps=500,
        prompts_per_step=64,
        seed=0,
        model=ModelSection(path="", param_dtype="bfloat16", compute_dtype="bfloat16"),
        task=TaskSection(
            name="jsonl_math",
            options={"path": "", "prompt_field": "question", "answer_field": "answer"},
            reward=RewardSection(format_weight=0.1),
        ),
        rollout=RolloutConfig(samples_per_prompt=8, max_prompt_tokens=256, max_new_tokens=512, mask_truncated=True),
        update=UpdateConfig(epochs=1, minibatches=2, micro_batches=8, chunk_size=512),
        optim=OptimConfig(lr=1e-6, warmup_steps=10, weight_decay=0.0, max_grad_norm=1.0),
        warm_start=WarmStartSection(steps=0),
        eval_every=25,
        eval_prompts=256,
        checkpoint_every=25,
    )
