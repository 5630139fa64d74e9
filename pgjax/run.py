"""The experiment runner: ``python -m pgjax.run experiments/<file>.py [--set key=value ...] [--resume]``.

One run = build (task, tokenizer, policy, algorithm) -> optional supervised warm
start -> ``steps`` RL steps of (sample, score, update). Everything a run writes
lives in its run directory (``runs/<name>`` unless ``run_dir`` is set):

  metrics.jsonl   one JSON line per RL step (and per evaluation)
  curves.png      reward / accuracy / length / KL / entropy curves at the end
  checkpoints/    orbax checkpoints every ``checkpoint_every`` steps and at the end
  tokenizer/      the task's tokenizer;  final/  the policy as a Hugging Face checkpoint

On several processes (``jax.distributed``, see ``parallel.multihost``) every
process runs this same loop on the global mesh and feeds its own rows of each
batch; process 0 alone writes the metrics, plot, tokenizer and final model, and
all processes write their shards of each orbax checkpoint.

A new run refuses a directory that already holds checkpoints (nothing saved is
overwritten); ``--resume`` continues from the newest complete checkpoint,
dropping metric lines written after it, and reproduces an uninterrupted run
step for step (same seed, same data, same PRNG keys).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from pgjax import core
from pgjax.models import hf
from pgjax.models.transformer import CausalLM, ModelConfig
from pgjax.parallel import multihost
from pgjax.parallel.mesh import check_batch, make_mesh, shard
from pgjax.rewards import combine, format_reward, make_task
from pgjax.sample import generate
from pgjax.train import experiment as experiment_lib
from pgjax.train.checkpoint import Checkpoints
from pgjax.train.experiment import Experiment
from pgjax.train.learner import Learner
from pgjax.train.optim import make_optimizer
from pgjax.train.rollout import collect, decode_responses, encode_prompts, pad_id, repeat_examples
from pgjax.train.sft import demonstrations, sft_step

TIMING_KEYS = ("time_sample", "time_prepare", "time_update", "time_step", "tokens_per_second")


def build_task(exp: Experiment):
    t = exp.task
    if t.name in ("arithmetic", "arithmetic_mix"):
        return make_task(t.name, digits=t.digits, ops=t.ops)
    if t.name == "scratchpad_arithmetic":
        return make_task(t.name, digits=t.digits, ops=t.ops, max_scratch=t.max_scratch, working=t.working)
    if t.name == "countdown":
        return make_task(t.name, count=t.numbers)
    return make_task(t.name, path=t.dataset, prompt_field=t.prompt_field, answer_field=t.answer_field)


def task_tokenizer(exp: Experiment, task):
    """The task's own tokenizer, else the checkpoint's (``model.path``)."""
    tokenizer = task.tokenizer()
    if tokenizer is None:
        if not exp.model.path:
            raise ValueError(f"task {exp.task.name!r} has no tokenizer of its own: set model.path to a checkpoint")
        tokenizer = hf.load_tokenizer(exp.model.path)
    return tokenizer


def build_policy(exp: Experiment, tokenizer) -> CausalLM:
    m = exp.model
    if m.path:
        return hf.load(m.path, m.param_dtype, m.compute_dtype)
    config = ModelConfig(family=m.family, vocab_size=len(tokenizer), hidden_size=m.hidden_size,
                         intermediate_size=m.intermediate_size, num_hidden_layers=m.layers,
                         num_attention_heads=m.heads, num_key_value_heads=m.kv_heads, head_dim=m.head_dim,
                         tie_word_embeddings=True, param_dtype=m.param_dtype, compute_dtype=m.compute_dtype)
    return CausalLM(config, nnx.Rngs(exp.seed))


def reward_function(exp: Experiment, task):
    if exp.task.format_weight:
        return combine((task.reward_fn, 1.0), (format_reward(task.format_pattern), exp.task.format_weight))
    return task.reward_fn


def run_directory(exp: Experiment, resume: bool) -> pathlib.Path:
    """``run_dir`` if set; else ``runs/<name>``, or for a new run the first of ``runs/<name>-2``, ``-3``, ...
    that holds no checkpoints (for ``--resume``: the last one that does)."""
    if exp.run_dir:
        return pathlib.Path(exp.run_dir)
    nth = lambda i: pathlib.Path("runs") / (exp.name if i == 1 else f"{exp.name}-{i}")
    i = 1
    while _has_checkpoints(nth(i)):
        i += 1
    return nth(max(i - 1, 1)) if resume else nth(i)


def _has_checkpoints(directory: pathlib.Path) -> bool:
    folder = directory / "checkpoints"
    return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


def read_records(directory) -> list[dict]:
    """The metric records of the run in ``directory`` (none before its first line)."""
    path = pathlib.Path(directory) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Run:
    """A run directory: its experiment, metrics file and checkpoints."""

    def __init__(self, exp: Experiment, resume: bool):
        self.exp = exp
        self.directory = run_directory(exp, resume)
        self.checkpoints = Checkpoints(self.directory / "checkpoints")
        self.resume_step = self.checkpoints.latest_step() if resume else None
        if resume and self.resume_step is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint in {self.checkpoints.directory}")
        if not resume and self.checkpoints.latest_step() is not None:
            raise FileExistsError(f"{self.directory} already holds checkpoints; pass --resume to continue it "
                                  f"or --set run_dir=... for a new run (nothing was overwritten)")
        self.metrics_path = self.directory / "metrics.jsonl"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.primary = multihost.is_primary()
        if not resume and self.primary:
            (self.directory / "experiment.json").write_text(json.dumps(dataclasses.asdict(exp), indent=2,
                                                                       default=str))

    def records(self) -> list[dict]:
        return read_records(self.directory)

    def truncate_metrics(self, last_step: int) -> None:
        """Keep the lines of steps <= ``last_step`` (those a checkpoint covers)."""
        if not self.primary:
            return
        kept = [r for r in self.records() if r["step"] <= last_step]
        self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def log(self, record: dict) -> None:
        if not self.primary:
            return
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def warm_start(exp: Experiment, task, tokenizer, policy: CausalLM, mesh: Mesh) -> CausalLM:
    """``warm_start.steps`` supervised steps on fresh demonstrations (seeded per step), sharded on
    ``mesh`` like the RL update; each process encodes its rows of each batch."""
    ws = exp.warm_start
    optimizer = make_optimizer(ws.optim)
    graphdef, params = nnx.split(policy)
    params = shard(params, mesh)
    opt_state = optimizer.init(params)
    for step in range(ws.steps):
        examples = task.examples(ws.batch_size, seed=_seed(exp.seed, "warm_start", step))
        batch = demonstrations(tokenizer, multihost.process_share(examples, mesh), exp.rollout.max_prompt_tokens,
                               exp.rollout.max_new_tokens)
        params, opt_state, loss = sft_step(graphdef, optimizer, params, opt_state,
                                           *multihost.to_global(batch, mesh))
        if (step % 50 == 0 or step == ws.steps - 1) and multihost.is_primary():
            print(f"warm start {step + 1}/{ws.steps}: loss {float(loss):.3f}", file=sys.stderr)
    return nnx.merge(graphdef, params)


def stop_tokens(exp: Experiment, tokenizer) -> tuple[int, ...]:
    """Tokens that end a response: the tokenizer's EOS, and the checkpoint's generation_config ones."""
    return hf.eos_token_ids(exp.model.path, tokenizer) if exp.model.path else (tokenizer.eos_token_id,)


def evaluate(exp: Experiment, task, tokenizer, policy: CausalLM, eos_ids, mesh: Mesh) -> float:
    """Greedy accuracy on ``eval_prompts`` held-out examples (a fixed seed apart from training);
    each process scores its rows."""
    examples = multihost.process_share(task.examples(exp.eval_prompts, seed=_seed(exp.seed, "eval", 0)), mesh)
    tokens, mask = encode_prompts(tokenizer, [e["prompt"] for e in examples], exp.rollout.max_prompt_tokens)
    config = exp.rollout.sampling(eos_ids, pad_id(tokenizer), greedy=True)
    samples = generate(policy, tokens, mask, jax.random.PRNGKey(0), config, mesh)
    response, lengths = multihost.to_host((samples.response, samples.lengths), mesh)
    prompts, fields = repeat_examples(examples, 1)
    completions = decode_responses(tokenizer, response, lengths, eos_ids)
    correct = np.asarray(task.reward_fn(prompts, completions, **fields) == 1.0, np.float32)
    return float(np.mean(multihost.gather_rows(correct, exp.eval_prompts, mesh)))


def _seed(seed: int, stream: str, index: int) -> int:
    """Independent deterministic integer seeds for the data streams of a run."""
    return int(np.random.SeedSequence([seed, sum(map(ord, stream)), index]).generate_state(1)[0])


def step_metrics(stats: dict, metrics: dict, times: dict) -> dict:
    """The JSONL record of one step: rollout statistics, finalized loss metrics, timing."""
    correct = stats["correct"] == 1.0
    lengths = stats["length"].astype(float)
    fm = {k: float(v) for k, v in core.finalize_metrics(metrics).items()}
    steps = fm.pop("optimizer_steps")
    out = {
        "reward": float(stats["reward"].mean()), "accuracy": float(correct.mean()),
        "length": float(lengths.mean()),
        "length_correct": float(lengths[correct].mean()) if correct.any() else None,
        "length_incorrect": float(lengths[~correct].mean()) if (~correct).any() else None,
        "truncated": float(stats["truncated"].mean()), "kept": float(stats["kept"].mean()),
        "policy_loss": fm.pop("policy_loss") / steps, "clip_fraction": fm["clip_fraction"],
        "grad_norm": fm["grad_norm_max"], "entropy": fm.get("entropy_mean"),
        "kl_ref": fm.get("ref_kl_mean"), "kl_old": fm["approx_kl_mean"],
    }
    if "value_loss" in fm:
        out["value_loss"] = fm["value_loss"] / steps
    generated = float(lengths.sum())
    out.update(times, tokens_per_second=generated / max(times["time_sample"], 1e-9))
    return out


STAT_KEYS = ("reward", "correct", "length", "truncated", "kept")


def train(exp: Experiment, resume: bool = False, progress: bool = True, observe=None) -> pathlib.Path:
    """Run ``exp``; returns the run directory.

    ``observe(learner, state, rollout, examples, stats, hp) -> dict``, if given, is called once per
    step after the rollout is prepared and before the update (``examples``: the step's prompts,
    every process's; ``stats``: all rows' reward / correct / length / truncated / kept); the floats
    it returns join the step's metrics record (an experiment's own measurements; its time counts
    in ``time_prepare``)."""
    multihost.initialize(exp.distributed)     # before any other JAX call
    mesh = make_mesh(exp.mesh)
    algo = exp.algorithm_preset()             # everything that can reject the input comes first
    hp = algo.hparams
    exp.update.check(exp.prompts_per_step, exp.rollout.samples_per_prompt, mesh)
    check_batch(exp.prompts_per_step, mesh, "prompts_per_step")
    check_batch(exp.eval_prompts, mesh, "eval_prompts")
    if exp.warm_start.steps:
        check_batch(exp.warm_start.batch_size, mesh, "warm_start.batch_size")
    task = build_task(exp)
    task.examples(1, seed=0)                  # a missing or malformed dataset fails here
    tokenizer = task_tokenizer(exp, task)
    policy = build_policy(exp, tokenizer)
    use_reference = bool(np.asarray(hp.kl_coef) > 0) and algo.spec.kl_placement != "none"
    critic_optimizer = make_optimizer(exp.critic_optim) if algo.spec.baseline == "value" else None
    learner = Learner(policy, algo, exp.rollout.samples_per_prompt, exp.update, make_optimizer(exp.optim),
                      critic_optimizer, use_reference, mesh)
    reward_fn = reward_function(exp, task)
    eos_ids = stop_tokens(exp, tokenizer)
    run = Run(exp, resume)
    if run.primary:
        tokenizer.save_pretrained(run.directory / "tokenizer")
    if run.resume_step is None:
        if exp.warm_start.steps:
            policy = warm_start(exp, task, tokenizer, policy, mesh)
        state = learner.init_state(policy, jax.random.PRNGKey(exp.seed))
        start = 0
        run.log({"step": 0, "eval_accuracy": evaluate(exp, task, tokenizer, learner.policy(state.params), eos_ids,
                                                      mesh)})
        run.checkpoints.save(0, state, {"step": 0, "data_position": 0})
    else:
        state, record = run.checkpoints.restore(learner.init_state(policy, jax.random.PRNGKey(exp.seed)))
        start = record["step"]
        run.truncate_metrics(start)
        print(f"resumed {run.directory} at step {start}", file=sys.stderr)
    bar = Progress(exp.steps, start, enabled=progress and run.primary)
    rows = exp.prompts_per_step * exp.rollout.samples_per_prompt
    for step in range(start, exp.steps):
        t0 = time.perf_counter()
        examples = task.examples(exp.prompts_per_step, seed=_seed(exp.seed, "train", step))
        rollout, stats = collect(learner.policy(state.params), tokenizer, multihost.process_share(examples, mesh),
                                 reward_fn, task.reward_fn, jax.random.fold_in(state.key, 1), exp.rollout,
                                 greedy_baseline=algo.spec.baseline == "greedy", eos_ids=eos_ids, mesh=mesh)
        stats = multihost.gather_rows({k: stats[k] for k in STAT_KEYS}, rows, mesh)
        t1 = time.perf_counter()
        rollout = jax.block_until_ready(learner.prepare(state, rollout, hp))
        observed = observe(learner, state, rollout, examples, stats, hp) if observe else {}
        t2 = time.perf_counter()
        state, metrics = learner.update(state, rollout, hp)
        metrics = jax.device_get(metrics)
        t3 = time.perf_counter()
        times = {"time_sample": t1 - t0, "time_prepare": t2 - t1, "time_update": t3 - t2, "time_step": t3 - t0}
        record = {"step": step + 1, **step_metrics(stats, metrics, times), **observed}
        if (step + 1) % exp.eval_every == 0 or step + 1 == exp.steps:
            record["eval_accuracy"] = evaluate(exp, task, tokenizer, learner.policy(state.params), eos_ids, mesh)
        run.log(record)
        bar.update(step + 1, record)
        if (step + 1) % exp.checkpoint_every == 0 or step + 1 == exp.steps:
            run.checkpoints.save(step + 1, state, {"step": step + 1,
                                                   "data_position": (step + 1) * exp.prompts_per_step})
    bar.close()
    params = multihost.gather(state.params)   # every process takes part; process 0 writes
    if run.primary:
        hf.save(learner.policy(params), run.directory / "final", tokenizer_dir=run.directory / "tokenizer")
        plot(run.records(), run.directory / "curves.png", exp.name)
    run.checkpoints.close()
    return run.directory


class Progress:
    """A one-line progress bar on stderr with the live reward and accuracy."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.total, self.enabled, self.started, self.start = total, enabled, time.perf_counter(), start
        self.eval_accuracy = None

    def update(self, step: int, record: dict) -> None:
        if not self.enabled:
            return
        self.eval_accuracy = record.get("eval_accuracy", self.eval_accuracy)
        done = step - self.start
        elapsed = time.perf_counter() - self.started
        eta = elapsed / max(done, 1) * (self.total - step)
        filled = int(30 * step / self.total)
        evaluation = "" if self.eval_accuracy is None else f" eval {self.eval_accuracy:.2f}"
        print(f"\r[{'#' * filled}{'.' * (30 - filled)}] {step}/{self.total} reward {record['reward']:.3f} "
              f"acc {record['accuracy']:.2f}{evaluation} {elapsed:.0f}s eta {eta:.0f}s", end="", file=sys.stderr)

    def close(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


CURVES = (("reward", "reward"), ("accuracy", "sampled accuracy"), ("eval_accuracy", "greedy eval accuracy"),
          ("length_correct", "length (correct)"), ("length_incorrect", "length (incorrect)"),
          ("entropy", "entropy"), ("kl_ref", "KL to reference"), ("clip_fraction", "clip fraction"))


def plot(records: list[dict], path, title: str) -> None:
    """One PNG with a panel per curve of ``CURVES`` that the run logged."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(k, label) for k, label in CURVES if any(r.get(k) is not None for r in records)]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.8), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        ax.plot(*zip(*points, strict=True), marker="." if len(points) < 30 else None)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", help="an experiment file defining experiment() -> Experiment")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field (dotted key); an unknown key lists the valid ones")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    exp = experiment_lib.override(experiment_lib.load(args.experiment), args.set)
    directory = train(exp, resume=args.resume, progress=not args.no_progress)
    if not multihost.is_primary():
        return
    records = [r for r in read_records(directory) if r.get("eval_accuracy") is not None]
    print(f"greedy eval accuracy: start {records[0]['eval_accuracy']:.3f} -> end {records[-1]['eval_accuracy']:.3f}"
          f"  ({directory})")


if __name__ == "__main__":
    main()
