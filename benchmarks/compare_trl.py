"""Seconds per GRPO step: pgjax vs TRL's ``GRPOTrainer`` on the same model and task, CPU, one process.

One step = 8 prompts x 8 sampled completions, then one optimizer step on all 64. Both sides
start from the same random Qwen2 checkpoint (built with transformers over the character
tokenizer of the arithmetic task, saved to a temporary directory, loaded in float32 by
``pgjax.models.hf.load`` and by ``AutoModelForCausalLM.from_pretrained``) and run the same step:

- prompts: ``"1234567+7654321="`` (``ArithmeticTask(digits=7)``): exactly 16 tokens each;
- sampling: temperature 1, no top-k / top-p, at most 16 new tokens; EOS (1 of the 17 tokens) ends
  a completion and both samplers stop when every row has ended (with this random model some row
  always runs to 16 tokens; completions average about 11 tokens);
- reward (one Python function for both): 1 for the right sum, plus 0.1 x the fraction of digits
  in the completion (so a random model's rewards are not all equal);
- loss: GRPO (group mean and std, 1/|o| per sequence, clipped ratio eps 0.2, beta = 0.04 times the
  k3 KL to a frozen reference model): pgjax's ``grpo`` preset, TRL's ``loss_type="grpo"``,
  ``scale_rewards="group"``, ``beta=0.04``; AdamW lr 1e-5, betas (0.9, 0.999), eps 1e-8, no weight
  decay, gradients clipped to norm 1, constant learning rate; no gradient checkpointing, float32.

Time split. pgjax (as in ``pgjax.run``): sampling = ``collect`` (sample, decode, reward);
scoring = ``Learner.prepare`` (old and reference log-probs, advantages); update =
``Learner.update`` (the optimizer step), each after ``jax.block_until_ready``. TRL: a step is
``on_step_begin`` -> ``on_step_end`` of a ``TrainerCallback``; sampling = its ``_generate``
(tokenize, ``model.generate``, decode) + ``_calculate_rewards``; scoring = the rest of
``_generate_and_score_completions`` (reference log-probs, advantages; TRL skips the old
log-probs when on-policy, pgjax recomputes them); update = the rest of the step (loss
forward + backward, clipping, AdamW). After ``--warmup`` steps (pgjax's compilation and TRL's
first steps), each of the ``--steps`` timed TRL steps is followed by one pgjax step (from a
``TrainerCallback``, outside TRL's timing), so machine noise hits both alike; a time is the
median over the timed steps. The ratio is TRL / pgjax seconds per step. Measure on an idle
machine: under CPU contention torch's threads slow down far more than XLA's (TRL 20-40x slower
per step on a 2-core machine with one other busy process), which inflates the ratio.

    pip install -e ".[bench]"
    python benchmarks/compare_trl.py [--steps 20] [--warmup 2] [--torch-threads N]
"""
import argparse
import functools
import os
import statistics
import tempfile
import time
import warnings

import jax
import numpy as np
import torch
import transformers
import trl
from datasets import Dataset

from pgjax import core
from pgjax.models import hf
from pgjax.rewards import ArithmeticTask, arithmetic_reward, is_arithmetic_answer, per_example
from pgjax.train.learner import Learner, UpdateConfig
from pgjax.train.optim import OptimConfig, make_optimizer
from pgjax.train.rollout import RolloutConfig, collect

PROMPTS, SAMPLES, TOKENS = 8, 8, 16
TASK = ArithmeticTask(digits=7)  # 7 + 1 + 7 + 1 = 16 characters = 16 tokens per prompt
GRPO = core.preset("grpo")
BETA = float(GRPO.hparams.kl_coef)  # 0.04
LR = 1e-5
PARTS = ("sampling", "scoring", "update")


@per_example
def reward(prompt, completion, *, target, **_):
    """1 for the right sum, plus 0.1 x the fraction of digit characters (dense for a random model)."""
    digits = sum(c.isdigit() for c in completion) / max(len(completion), 1)
    return float(is_arithmetic_answer(completion, target)) + 0.1 * digits


def trl_reward(prompts, completions, target, **_):
    return reward(prompts, completions, target=target).tolist()


def save_random_model(directory, tokenizer, args):
    torch.manual_seed(args.seed)
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=2 * TOKENS, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


class PgjaxStep:
    """One timed pgjax GRPO step per call: {part: seconds}."""

    def __init__(self, directory, tokenizer, seed):
        policy = hf.load(directory)
        self.tokenizer, self.model = tokenizer, policy
        optimizer = make_optimizer(OptimConfig(lr=LR, b2=0.999, max_grad_norm=1.0))
        self.learner = Learner(policy, GRPO, SAMPLES, UpdateConfig(), optimizer, None, use_reference=True)
        self.state = self.learner.init_state(policy, jax.random.PRNGKey(seed))
        self.rollout = RolloutConfig(samples_per_prompt=SAMPLES, max_prompt_tokens=TOKENS, max_new_tokens=TOKENS)
        self.step = 0

    def __call__(self):
        examples = TASK.examples(PROMPTS, seed=self.step)
        t0 = time.perf_counter()
        rollout, _ = collect(self.learner.policy(self.state.params), self.tokenizer, examples, reward,
                             arithmetic_reward, jax.random.fold_in(self.state.key, 1), self.rollout)
        rollout = jax.block_until_ready(rollout)
        t1 = time.perf_counter()
        rollout = jax.block_until_ready(self.learner.prepare(self.state, rollout, GRPO.hparams))
        t2 = time.perf_counter()
        self.state, _ = jax.block_until_ready(self.learner.update(self.state, rollout, GRPO.hparams))
        t3 = time.perf_counter()
        self.step += 1
        return dict(zip(PARTS, (t1 - t0, t2 - t1, t3 - t2)))


def time_method(obj, name, totals):
    """Wrap the bound method ``obj.name`` to add its seconds to ``totals[name]``."""
    method = getattr(obj, name)

    @functools.wraps(method)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - start

    setattr(obj, name, timed)


class Interleave(transformers.TrainerCallback):
    """Times each TRL step (split via the wrapped methods' ``totals``), then runs one pgjax step."""

    def __init__(self, totals, pgjax_step, warmup):
        self.totals, self.pgjax_step, self.warmup = totals, pgjax_step, warmup
        self.trl, self.pgjax = [], []

    def on_step_begin(self, args, state, control, **kwargs):
        self.totals.clear()
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        total = time.perf_counter() - self.start
        t = self.totals
        sampling = t["_generate"] + t["_calculate_rewards"]
        scoring = t["_generate_and_score_completions"] - sampling
        if state.global_step > self.warmup:
            self.trl.append(dict(zip(PARTS, (sampling, scoring, total - t["_generate_and_score_completions"]))))
            self.pgjax.append(self.pgjax_step())


def trl_trainer(directory, tokenizer, model, args, output_dir):
    config = trl.GRPOConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, fp16=False, seed=args.seed,
        per_device_train_batch_size=PROMPTS * SAMPLES, gradient_accumulation_steps=1, num_generations=SAMPLES,
        num_iterations=1, max_completion_length=TOKENS, temperature=1.0, top_k=0, top_p=1.0,
        beta=BETA, loss_type="grpo", scale_rewards="group", epsilon=0.2,
        learning_rate=LR, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
        max_grad_norm=1.0, lr_scheduler_type="constant", gradient_checkpointing=False,
        max_steps=args.warmup + args.steps, logging_strategy="no", save_strategy="no", report_to=[],
        disable_tqdm=True, dataloader_num_workers=0)
    dataset = Dataset.from_list(TASK.examples(PROMPTS * (args.warmup + args.steps), seed=10_000))
    return trl.GRPOTrainer(model=model, reward_funcs=trl_reward, args=config, train_dataset=dataset,
                           processing_class=tokenizer)


def median_parts(steps):
    out = {part: statistics.median(s[part] for s in steps) for part in PARTS}
    out["step"] = statistics.median(sum(s[p] for p in PARTS) for s in steps)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps of each")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=384)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=None, help="default: torch's own (one per core)")
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    tokenizer = TASK.tokenizer()
    started, load = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as directory, tempfile.TemporaryDirectory() as output_dir:
        save_random_model(directory, tokenizer, args)
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        pgjax_step = PgjaxStep(directory, tokenizer, args.seed)
        check = np.asarray([tokenizer(e["prompt"])["input_ids"] for e in TASK.examples(2, seed=1)])
        with torch.no_grad():
            expected = model(torch.from_numpy(check)).logits.numpy()
        gap = float(np.abs(np.asarray(pgjax_step.model(check)) - expected).max())
        for _ in range(args.warmup):
            pgjax_step()  # compiles
        trainer = trl_trainer(directory, tokenizer, model, args, output_dir)
        totals = {}
        for name in ("_generate", "_calculate_rewards", "_generate_and_score_completions"):
            time_method(trainer, name, totals)
        timer = Interleave(totals, pgjax_step, args.warmup)
        trainer.add_callback(timer)
        trainer.remove_callback(transformers.PrinterCallback)  # TRL's end-of-training summary
        trainer.train()
    rows = {"TRL GRPOTrainer": median_parts(timer.trl), "pgjax": median_parts(timer.pgjax)}
    print(f"pgjax (jax {jax.__version__}) vs trl {trl.__version__} (torch {torch.__version__}, "
          f"transformers {transformers.__version__}); {os.cpu_count()} CPUs, torch {torch.get_num_threads()} threads, "
          f"load average {load:.2f} at the start; total run {time.perf_counter() - started:.0f} s")
    print(f"Qwen2: vocab {len(tokenizer)}, hidden {args.hidden}, intermediate {args.intermediate}, {args.layers} "
          f"layers, {args.heads} heads ({args.kv_heads} kv), float32; max |logit gap| pgjax vs torch {gap:.1e}; "
          f"{PROMPTS} prompts x {SAMPLES} samples, {TOKENS}-token prompts, <= {TOKENS} new tokens; GRPO, "
          f"beta {BETA}; median of {len(timer.trl)} steps after {args.warmup} warm-up steps, interleaved\n")
    print("| implementation | s / step | sampling | scoring | update | ratio |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: |")
    trl_step = rows["TRL GRPOTrainer"]["step"]
    for name, r in rows.items():
        print(f"| {name} | {r['step']:.3f} | {r['sampling']:.3f} | {r['scoring']:.3f} | {r['update']:.3f} "
              f"| {trl_step / r['step']:.1f} |")


if __name__ == "__main__":
    main()
