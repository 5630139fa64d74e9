"""Seconds per GRPO step: pgjax vs Google's tunix (``GRPOLearner`` on an ``RLCluster``) on the same model,
prompts and step, CPU.

What is compared. Both sides load the same checkpoint in float32 (pgjax: ``pgjax.models.hf.load`` with a run's
default model options, as ``compare_trl.py``; tunix: its own model class, ``qwen2`` or ``llama3``, built from the
checkpoint's ``config.json`` and loaded by its ``create_model_from_safe_tensors``) and run the same GRPO step on
the same prompts:

- default (quick): ``compare_trl.py``'s random Qwen2 over the arithmetic task's character tokenizer (built with
  transformers into a temporary directory that both children load); 8 prompts ``"1234567+7654321="`` x 8 samples.
- ``--model DIR``: a converted real model (SmolLM2-135M-Instruct, a Llama); ``word_math`` prompts through the
  model's chat template; 4 prompts x 8 samples.

The workload, the plan of prompts and pgjax's step are ``compare_trl.py``'s (``workload_and_plan``,
``PgjaxStep``), with one change: the reward of both sides is the task's verifier (``arithmetic_reward``,
``word_math_reward``), importable in tunix's environment, where ``compare_trl.py`` (torch, TRL) is not. A random
model's rewards are then all 0 and its advantages 0; neither side skips such groups, so the work is the same.

Matched work. One plan of prompts is drawn before anything runs (``compare_trl.step_seed``). pgjax's step k
samples plan[k]; tunix's learner gets a dataset whose k-th batch is plan[k] (``{"prompts": NumPy array, "target":
...}``, in order, no shuffling), one batch per global step (mini-batch = micro-batch = the batch, so one optimizer
step per batch). tunix tokenizes each prompt with the tokenizer it is given: here an adapter (tunix's duck-typed
``encode``/``decode``/``bos_id``/``eos_id``/``pad_id``) whose ``encode`` is pgjax's ``PromptFormat.token_ids``, so
both sides read the same token ids; the tunix child checks that every row of the sampler's left-padded prompt
ends with them, and the parent stops with an error unless every timed step of both sides saw the plan's prompts,
fed the model as many prompt tokens as the plan renders to, and generated exactly prompts x samples x
``--new-tokens`` tokens. Both sides pad prompts to the plan's longest (tunix's ``max_prompt_length``).
Forced lengths: every row generates exactly ``--new-tokens`` tokens. pgjax's sampler gets no stop token; tunix's
sampler falls back to the tokenizer's EOS when given none, so it gets one id outside the vocabulary (never
sampled). Sampling: temperature 1, no top-k; tunix samples through its top-p path with p = 1 (the same
distribution; its sampler is greedy without top-p or top-k). Seeds: pgjax's key is ``PRNGKey(step seed)``; tunix's
``RolloutConfig.seed`` is set to the step seed before each generation (unset, tunix reuses ``PRNGKey(0)`` every
step). The generators differ, so the samples do not.

Loss: GRPO with the frozen reference (a second copy of the checkpoint on both sides): group-normalized
advantages, clipped ratio eps 0.2, 1/|o| per sequence then the mean over sequences (tunix's
``loss_agg_mode="sequence-mean-token-mean"``), beta 0.04 times the k3 estimator of the KL to the reference
(tunix's default ``kl_loss_mode`` is ``"kl"``, the k1 estimator log p - log p_ref; this script sets
``"low_var_kl"``, exp(d) - d - 1 with d = log p_ref - log p, which is k3, pgjax's ``grpo`` preset). One epoch
(``num_iterations=1``): neither side computes old log-probs. The optimizer is pgjax's ``make_optimizer`` on both
sides (the same optax chain: clip by global norm 1, AdamW lr 1e-5, betas (0.9, 0.999), eps 1e-8, no weight decay,
constant rate). The advantages are the same: (r - group mean) / (group std with ddof 1 + 1e-6). Differences left:
tunix masks completion tokens equal to the pad id, so where pad is a real token (SmolLM2: ``<|im_end|>``) a forced
row that samples it is scored and trained on one token fewer; tunix scores and trains on the full padded width
(prompt width + new tokens), pgjax on the batch trimmed to its padding (``rollout.trim_padding``); each model runs
at its library's defaults: pgjax's stacked layers recomputed in the backward pass, tunix's layers without remat
(``RematConfig.NONE``); tunix's loss also computes the entropy of the logits (a logged metric).

tunix's Llama ignores the checkpoint's ``rope_theta`` (its attention calls ``apply_rope`` with the default 1e6):
a correctness patch binds the checkpoint's value (SmolLM2: 1e5); tunix's Qwen2 reads it. Meshes are one device,
axes ``("fsdp", "tp")``, ``AxisType.Auto``. The tunix child reports the max |logit gap| of its model and pgjax's
on two of the plan's prompts: that both load the same model.

Time split. pgjax, as ``compare_trl.py``: sampling = ``collect`` (sample, decode, reward); scoring =
``Learner.prepare``; update = ``Learner.update``, each after ``jax.block_until_ready``. tunix: a step is
``RLLearner._run_global_step`` followed by ``jax.block_until_ready`` of the actor's parameters; sampling =
``RLCluster.generate`` (tokenize, prefill, decode, detokenize) + the rewards (``_compute_rewards``); scoring = the
rest of ``_generate_and_compute_advantage`` (reference log-probs, advantages), whose result this script blocks on
(tunix would leave the reference forward in flight into the update); update = the rest of the step (the actor
trainer's loss forward + backward and optimizer step, and tunix's bookkeeping).

Each side at its defaults, alone in its own child process (``--only pgjax|tunix``, printing its steps as JSON as
its last line) with glibc's default malloc (``compare_trl.ALLOCATOR_VARIABLES`` removed from the environment):
pgjax in this environment, tunix with ``--tunix-python`` (a separate virtual environment holding tunix and pgjax
installed without its dependencies: pgjax's tasks, prompt rendering, optimizer and reference model for the logit
check). ``--rounds`` rounds in ABBA order (tunix first in odd rounds), each child running ``--warmup`` untimed
steps then ``--steps`` timed ones. A row's seconds are medians over its timed steps pooled across rounds; the
ratio (tunix seconds / pgjax seconds, > 1: pgjax faster) is the ratio of pooled medians with a
percentile-bootstrap 95% interval (``pgjax.evaluation.statistics``; only the ratio below its ``MIN_STEPS``), for
the whole step, each phase and seconds per 1000 generated tokens.

Saved (``--json PATH``, through ``readme_tables.save_table``): the table, the parent's provenance with each
child's threads and environment, tunix's version, the plan's prompts, the logit gap and every timed step of every
child (seconds per phase, generated and prompt tokens, kernel seconds and minor page faults, peak RSS so far).

    python3 -m venv .venv-tunix                       # tunix's environment, once, at the same jax
    .venv-tunix/bin/pip install google-tunix==0.1.7 "jax==$(python -c 'import jax; print(jax.__version__)')" chex
    .venv-tunix/bin/pip install --no-deps -e .
    python benchmarks/compare_tunix.py [--steps 5] [--warmup 2] [--rounds 2] [--json PATH]
    python benchmarks/compare_tunix.py --model models/smollm2-135m-instruct --steps 4 --warmup 1 --json PATH
"""
import argparse
import dataclasses
import functools
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import measure
import numpy as np
import provenance
from flax import nnx
from readme_tables import save_table

from pgjax import core, markdown
from pgjax.config import OptimConfig
from pgjax.models import hf
from pgjax.rollout.collect import PromptFormat, encode_prompts
from pgjax.train.optim import make_optimizer

GRPO = core.preset("grpo")
BETA = float(GRPO.hparams.kl_coef)
LR = 1e-5
PARTS = ("sampling", "scoring", "update")
TUNIX_NAME = "tunix GRPOLearner"
# tunix's environment, beside the repository's own .venv (docs/benchmarks.md: "One GRPO step vs tunix")
TUNIX_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-tunix", "bin",
                            "python")


def trl_harness():
    """``compare_trl.py``'s harness, imported only where it can be: it imports torch and TRL, which tunix's
    environment does not have."""
    import compare_trl
    return compare_trl


def optimizer():
    """Both sides' optimizer: pgjax's clip-then-AdamW chain."""
    return make_optimizer(OptimConfig(lr=LR, b2=0.999, max_grad_norm=1.0))


def verifier_workload(args, scratch):
    """``compare_trl``'s workload and plan, the reward replaced by the task's verifier."""
    work, plan = trl_harness().workload_and_plan(args, scratch)
    return dataclasses.replace(work, reward=work.correct), plan


def tunix_job(work, plan, args) -> dict:
    """What the tunix child needs of the workload, as JSON: it cannot build ``compare_trl``'s."""
    return {"directory": os.path.abspath(work.directory), "prompt_format": dataclasses.asdict(work.prompt_format),
            "reward": f"{work.reward.__module__}:{work.reward.__name__}", "prompt_width": work.prompt_width,
            "samples": work.samples, "new_tokens": work.new_tokens, "seed": args.seed, "plan": plan}


class PromptTokenizer:
    """tunix's tokenizer protocol over a Hugging Face tokenizer: ``encode`` renders a task prompt the way pgjax
    does (``PromptFormat.token_ids``) and records the ids; no BOS of tunix's own (the rendering has it)."""

    def __init__(self, tokenizer, prompt_format: PromptFormat):
        self.tokenizer, self.prompt_format, self.encoded = tokenizer, prompt_format, []

    def encode(self, text: str, **_) -> list[int]:
        ids = list(self.prompt_format.token_ids(self.tokenizer, [text])[0])
        self.encoded.append(ids)
        return ids

    def decode(self, ids, **_) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def bos_id(self):
        return None

    def eos_id(self) -> int:
        return self.tokenizer.eos_token_id

    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id


def reward_function(path: str):
    module, name = path.split(":")
    return getattr(__import__(module, fromlist=[name]), name)


def tunix_reward(reward):
    """tunix calls a reward with every batch field (and ``mode``, ``trajectory_ids``) as keywords."""
    def scored(prompts, completions, target, **_):
        return np.asarray(reward(list(prompts), list(completions), target=list(target)), np.float64).tolist()
    return scored


def checkpoint_config(directory: str) -> dict:
    with open(os.path.join(directory, "config.json")) as f:
        return json.load(f)


def tunix_model(directory: str, mesh):
    """The checkpoint as tunix's own model class (``qwen2`` or ``llama``), float32, on ``mesh``; Llama's RoPE
    patched to the checkpoint's ``rope_theta`` (see the module docstring)."""
    from tunix.models.llama3 import model as llama3_model
    from tunix.models.llama3 import params as llama3_params
    from tunix.models.qwen2 import model as qwen2_model
    from tunix.models.qwen2 import params as qwen2_params
    config = checkpoint_config(directory)
    theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    shape = {"num_layers": config["num_hidden_layers"], "vocab_size": config["vocab_size"],
             "embed_dim": config["hidden_size"], "hidden_dim": config["intermediate_size"],
             "num_heads": config["num_attention_heads"], "num_kv_heads": config["num_key_value_heads"],
             "head_dim": config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
             "rope_theta": int(theta), "norm_eps": config["rms_norm_eps"]}
    tied = bool(config.get("tie_word_embeddings", False))
    if config["model_type"] == "qwen2":
        return qwen2_params.create_model_from_safe_tensors(
            directory, qwen2_model.ModelConfig(**shape, use_tied_embedding=tied), mesh, dtype=jnp.float32)
    if config["model_type"] == "llama":
        if not isinstance(llama3_model.apply_rope, functools.partial):
            llama3_model.apply_rope = functools.partial(llama3_model.apply_rope, rope_theta=int(theta))
        return llama3_params.create_model_from_safe_tensors(
            directory, llama3_model.ModelConfig(**shape, weight_tying=tied), mesh, dtype=jnp.float32)
    raise ValueError(f"tunix has no {config['model_type']!r} here: qwen2 or llama")


def tunix_logits_gap(model, directory: str, tokenizer, prompt_format: PromptFormat, prompts: list[str]) -> float:
    """Max |logit difference| of tunix's model and pgjax's on the real tokens of ``prompts``."""
    tokens, mask = encode_prompts(tokenizer, prompts, max(len(ids) for ids in prompt_format.token_ids(
        tokenizer, prompts)), prompt_format)
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    attention = np.tril(np.ones((tokens.shape[1],) * 2, bool))[None] & mask[:, None, :].astype(bool)
    logits, _ = model(jnp.asarray(tokens), jnp.asarray(positions), None, jnp.asarray(attention))
    expected = np.asarray(hf.load(directory)(tokens, mask))
    real = mask.astype(bool)
    return float(np.abs(np.asarray(logits)[real] - expected[real]).max())


class TunixSteps:
    """Times each global step of a tunix ``GRPOLearner`` (split by wrapping its methods) and sets each step's
    sampling seed; checks the prompt tokens the sampler fed the model."""

    def __init__(self, learner, rollout, tokenizer: PromptTokenizer, samples: int, seed: int, warmup: int):
        self.learner, self.rollout, self.tokenizer = learner, rollout, tokenizer
        self.samples, self.seed, self.warmup = samples, seed, warmup
        self.steps, self.totals, self.k = [], {}, 0
        measure.wrap_method(learner.rl_cluster, "generate", self.seed_step, self.sampled)
        measure.wrap_method(learner, "_compute_rewards", after=self.rewarded)
        measure.wrap_method(learner, "_generate_and_compute_advantage", after=self.prepared)
        measure.wrap_method(learner, "_run_global_step", self.begin, self.end)

    def seed_step(self, prompts, *_, **__):
        self.rollout.seed = step_seed(self.seed, self.k)
        self.prompts = [str(p) for p in prompts[::self.samples]]
        self.tokenizer.encoded.clear()

    def sampled(self, output, seconds):
        fed = self.tokenizer.encoded
        for row, ids in zip(np.asarray(output.left_padded_prompt_tokens), fed, strict=True):
            if list(row[len(row) - len(ids):]) != ids:
                raise AssertionError(f"tunix fed {list(row)}, the prompt renders to {ids}")
        self.totals.update(generate=seconds, generated=sum(len(t) for t in output.tokens),
                           prompt_tokens=sum(len(ids) for ids in fed) // self.samples)
        return output

    def rewarded(self, rewards, seconds):
        self.totals["rewards"] = seconds
        return rewards

    def prepared(self, example, seconds):
        start = time.perf_counter()
        example = jax.block_until_ready(example)
        self.totals["prepare"] = seconds + time.perf_counter() - start
        return example

    def begin(self, *_, **__):
        self.totals.clear()
        self.start, self.usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)

    def end(self, result, _):
        jax.block_until_ready(nnx.state(self.learner.rl_cluster.actor_trainer.model))
        total, t = time.perf_counter() - self.start, self.totals
        sampling = t["generate"] + t["rewards"]
        if self.k >= self.warmup:
            self.steps.append({"step": self.k, "sampling": sampling, "scoring": t["prepare"] - sampling,
                               "update": total - t["prepare"], "generated": t["generated"],
                               "prompt_tokens": t["prompt_tokens"], "prompts": self.prompts,
                               **measure.kernel_cost(self.usage), "peak_rss_gib": measure.peak_rss_gib()})
        self.k += 1
        return result


def step_seed(seed: int, k: int) -> int:
    """``compare_trl.step_seed`` (that module cannot be imported here)."""
    return 1_000_000 * seed + k


def run_tunix(job: dict, args) -> dict:
    """tunix's GRPO training run over the plan (see the module docstring): its timed steps, the stop ids its
    sampler was given, the logit gap and tunix's version."""
    from transformers import AutoTokenizer
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    directory, samples, plan = job["directory"], job["samples"], job["plan"][:args.warmup + args.steps]
    prompt_format = PromptFormat(**job["prompt_format"])
    tokenizer = PromptTokenizer(AutoTokenizer.from_pretrained(directory), prompt_format)
    policy, reference = tunix_model(directory, mesh), tunix_model(directory, mesh)
    gap = tunix_logits_gap(policy, directory, tokenizer.tokenizer, prompt_format, [e["prompt"] for e in plan[0][:2]])
    never = [checkpoint_config(directory)["vocab_size"]]     # an id the sampler cannot draw: no stop token
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=job["new_tokens"], max_prompt_length=job["prompt_width"],
        kv_cache_size=job["prompt_width"] + job["new_tokens"], temperature=1.0, top_p=1.0, top_k=None,
        eos_tokens=never, data_type=jnp.float32)
    steps = args.warmup + args.steps
    training = rl_cluster_lib.RLTrainingConfig(actor_optimizer=optimizer(), eval_every_n_steps=steps + 1,
                                               max_steps=steps)
    roles = {role: mesh for role in (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE,
                                     rl_cluster_lib.Role.ROLLOUT)}
    cluster = rl_cluster_lib.RLCluster(
        actor=policy, reference=reference, tokenizer=tokenizer,
        cluster_config=rl_cluster_lib.ClusterConfig(role_to_mesh=roles, rollout_engine="vanilla",
                                                    offload_to_cpu=False, training_config=training,
                                                    rollout_config=rollout))
    config = grpo_learner.GRPOConfig(num_generations=samples, num_iterations=1, beta=BETA, epsilon=0.2,
                                     kl_loss_mode="low_var_kl", loss_agg_mode="sequence-mean-token-mean")
    learner = grpo_learner.GRPOLearner(cluster, config, reward_fns=tunix_reward(reward_function(job["reward"])))
    timer = TunixSteps(learner, rollout, tokenizer, samples, job["seed"], args.warmup)
    learner.train([{"prompts": np.array([e["prompt"] for e in examples]),
                    "target": np.array([e["target"] for e in examples])} for examples in plan])
    return {"steps": timer.steps, "stop_ids": never, "logits_gap": gap,
            "tunix": importlib.metadata.version("google-tunix")}


def only(args):
    """``--only``: one side alone; print, as the last line (JSON), its timed steps, peak RSS, threads and
    environment."""
    if args.only == "pgjax":
        with tempfile.TemporaryDirectory() as scratch:
            work, plan = verifier_workload(args, scratch)
            return trl_harness().only("pgjax", work, plan, args)
    with open(args.job) as f:
        out = run_tunix(json.load(f), args)
    mine = provenance.record()
    print(json.dumps({**out, "peak_rss_gib": measure.peak_rss_gib(),
                      "threads": mine["threads"], "environment": mine["environment"]}))


def child_argv(args, side: str, job: str) -> list[str]:
    argv = ["--only", side, "--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed),
            "--plan-steps", str(args.warmup + args.steps), "--job", job]
    for name in ("model", "random_dir", "prompts", "samples", "new_tokens", "hidden", "intermediate", "layers",
                 "heads", "kv_heads"):
        value = getattr(args, name)
        if value is not None:
            argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


def child(args, side: str, job: str) -> dict:
    """``side`` alone in a child process at glibc's default malloc: pgjax with this Python, tunix with
    ``--tunix-python``."""
    environment = {k: v for k, v in os.environ.items() if k not in trl_harness().ALLOCATOR_VARIABLES}
    python = sys.executable if side == "pgjax" else args.tunix_python
    done = subprocess.run([python, os.path.abspath(__file__), *child_argv(args, side, job)],
                          check=False, capture_output=True, text=True, env=environment)
    if done.returncode:
        raise RuntimeError(f"{side}'s child process failed ({done.returncode}):\n{done.stderr[-6000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_rounds(args, job: str) -> tuple[dict, dict]:
    """Each side's child process ``--rounds`` times in ABBA order (tunix first in odd rounds):
    {side: [each round's output]}, {"side, round r": its threads and environment}."""
    runs, children = {"tunix": [], "pgjax": []}, {}
    for r in range(args.rounds):
        for position, side in enumerate(("tunix", "pgjax") if r % 2 == 0 else ("pgjax", "tunix")):
            out = child(args, side, job)
            out["round"], out["position"] = r + 1, position
            runs[side].append(out)
            children[f"{side}, round {r + 1}"] = {"threads": out.pop("threads"), "environment": out.pop("environment")}
            step = statistics.median(trl_harness().step_seconds(out["steps"]))
            print(f"round {r + 1}/{args.rounds}: {side} {step:.3f} s/step", file=sys.stderr, flush=True)
    return runs, children


def summarize(runs: dict) -> dict:
    """Each side's pooled medians and, for pgjax, tunix / pgjax ratios with their intervals."""
    trl = trl_harness()
    pooled = {side: [s for run in done for s in run["steps"]] for side, done in runs.items()}
    summary = {}
    for side, steps in pooled.items():
        r = summary[side] = trl.median_parts(steps)
        r["peak_rss_gib"] = max(run["peak_rss_gib"] for run in runs[side])
        r["rounds"] = [trl.median_parts(run["steps"]) for run in runs[side]]
    a, b = pooled["tunix"], pooled["pgjax"]
    summary["pgjax"]["ratios"] = {**{p: trl.compare([s[p] for s in a], [s[p] for s in b]) for p in PARTS},
                                  "step": trl.compare(trl.step_seconds(a), trl.step_seconds(b)),
                                  "per_1k_tokens": trl.compare(trl.per_1k_tokens(a), trl.per_1k_tokens(b))}
    return summary


def table_lines(summary: dict, args) -> list[str]:
    seconds = measure.seconds
    names = {"tunix": TUNIX_NAME, "pgjax": "pgjax"}
    lines = markdown.table(["implementation", "s / step", "sampling", "scoring", "update", "tokens generated / step",
                            "s / 1k tokens", "peak RSS"],
                           [[names[side], *(seconds(r[p], r["step"]) for p in ("step", *PARTS)),
                             f"{r['generated']:.0f}", f"{r['s_per_1k_tokens']:.3f}", f"{r['peak_rss_gib']:.1f} GiB"]
                            for side, r in summary.items()]).splitlines()
    ratios = summary["pgjax"]["ratios"]
    lines += ["", *markdown.table(["tunix / pgjax, ratio of pooled medians [95% bootstrap interval]", "s / step",
                                   "sampling", "scoring", "update", "s / 1k tokens"],
                                  [["tunix / pgjax", *(measure.ratio_text(ratios[p])
                                                       for p in ("step", *PARTS, "per_1k_tokens"))]]).splitlines()]
    lines += ["", f"Each round's median s / step ({args.steps} timed steps per child): " + "; ".join(
        f"{names[side]} " + ", ".join(seconds(x["step"], x["step"]) for x in r["rounds"])
        for side, r in summary.items()) + "."]
    return lines


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    measure.add_harness_arguments(parser, "tunix")
    parser.add_argument("--tunix-python", default=TUNIX_PYTHON,
                        help="the Python of an environment with tunix and pgjax (pip install --no-deps -e .)")
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.lengths = "forced"                 # compare_trl's PgjaxStep and check_matched read it
    return args


def main(argv=None):
    args = parse(argv)
    if args.only:
        return only(args)
    if not os.path.exists(args.tunix_python):
        sys.exit(f"compare_tunix.py: no tunix environment at {args.tunix_python}: make one (the module docstring: "
                 "python3 -m venv .venv-tunix, then pip install google-tunix, jax at this version and chex, and pgjax "
                 "with --no-deps) or name its Python with --tunix-python")
    started, load = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        work, plan = verifier_workload(args, scratch)
        job = os.path.join(scratch, "tunix_job.json")
        with open(job, "w") as f:
            json.dump(tunix_job(work, plan, args), f)
        runs, children = run_rounds(args, job)
    trl_harness().check_matched(runs, plan, work, args)
    summary = summarize(runs)
    gap = max(run["logits_gap"] for run in runs["tunix"])
    tunix_version = runs["tunix"][0]["tunix"]
    prompt_tokens = float(np.mean([n for examples in plan[args.warmup:] for n in work.prompt_tokens(examples)]))
    header = (f"pgjax vs tunix {tunix_version} (jax {jax.__version__} on both sides); "
              f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average {load:.2f} at the "
              f"start; total run {time.perf_counter() - started:.0f} s")
    setup = (f"{work.description}; float32; max |logit gap| tunix vs pgjax {gap:.1e}; {work.prompts} prompts x "
             f"{work.samples} samples, the same prompts and prompt tokens on both sides every step (checked), "
             f"~{prompt_tokens:.0f}-token prompts, exactly {work.new_tokens} new tokens per row; GRPO, beta {BETA}, "
             f"k3 KL; reward: the task's verifier; each side alone in its own process at glibc's default malloc, "
             f"{args.rounds} round(s) in ABBA order of {args.warmup} warm-up + {args.steps} timed steps; medians of "
             f"the {args.steps * args.rounds} pooled timed steps")
    print(f"{header}\n{setup}\n", flush=True)
    for done in runs.values():        # the plan holds the prompts, checked equal to every step's
        for run in done:
            for s in run["steps"]:
                s.pop("prompts")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    save_table(args.json, sys.argv[1:] if argv is None else argv, table_lines(summary, args),
               provenance=provenance.record(children=children), header=header, setup=setup, tunix=tunix_version,
               gap=gap, prompt_tokens=prompt_tokens, plan=[[e["prompt"] for e in examples] for examples in plan],
               rows=summary, runs=runs)


if __name__ == "__main__":
    main()
