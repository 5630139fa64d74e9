"""The main job over five seeds on one machine: the evidence behind the README's main-job row
(``experiments/arithmetic_dr_grpo.py``: Dr. GRPO on 2-digit addition after a supervised warm start).

    python experiments/studies/main_job_seeds.py --plan      # each job: done or missing, and its time
    python experiments/studies/main_job_seeds.py             # runs every missing job (minutes: see --plan)
    python experiments/studies/main_job_seeds.py --report    # the tables and the plot from what exists

A ``pgjax.study`` whose runs train in this process (``InProcess``: the five runs share their compiled
programs). Each seed (``seed=S``) draws its own warm-start data, prompts and samples; the report gives
each seed's last greedy evaluation on the run's held-out prompts, their mean with its t interval across
seeds and their range, and the curves.
"""
from pgjax import study

STUDY = study.Study(
    name="main_job_seeds", experiment="experiments/arithmetic_dr_grpo.py", base_model="",
    methods={"dr_grpo": ()}, seeds=(0, 1, 2, 3, 4), runner=study.InProcess(),
    train_minutes=1.5, machine="the 2-core Xeon with AVX-512 FP16 and AMX of docs/benchmarks.md",
    curve_title="The main job (Dr. GRPO, 2-digit addition), five seeds",
    record_metrics=("reward",), record_window=50)

if __name__ == "__main__":
    study.main(STUDY, description=__doc__)
