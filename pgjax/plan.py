"""Will it fit? The per-device memory of one RL training step, from the compiler, no weights allocated.

    python -m pgjax.plan --model pgjax/models/configs/qwen2.5-0.5b --mesh data=1,fsdp=8 --batch 128 \\
        --prompt-len 256 --response-len 768 --remat save_nothing --scan-layers

(``--mesh``: sizes of the data, fsdp and tensor axes; ``--devices``: their product unless one is -1;
``--batch``: rows, prompt groups x ``--group-size``) builds the real ``Learner``
(``pgjax.train.learner``) for a model config (a Hugging Face config.json, read offline), AdamW
(``learner.build_learner`` with ``OptimConfig()``) and an algorithm preset on a device mesh, with every array
abstract: the policy is constructed inside ``jax.eval_shape`` (its weights are tracers there, never
allocated), and the training state and the rollout are ``jax.ShapeDtypeStruct``s carrying the
shardings the Learner itself uses (``learner.state_sharding``, ``parallel.mesh.batch_sharding``).
It lowers and compiles the two jitted programs of an RL step, ``Learner.prepare`` (old and reference
log-probs, critic values, advantages) and ``Learner._optimizer_step`` (the gradient over
``micro_batches``, AdamW, the finiteness check; the state donated), and reads XLA's buffer assignment
(``compiled.memory_analysis()``: argument, output, alias and temp sizes).

Per device, in bytes of one device's shard (``sharding.shard_shape``, not total / devices):
  parameters, optimizer state, reference parameters: the training state, from its shardings;
  gradients: as many bytes as the trainable parameters; they live in the step's temp, not added again;
  temp: XLA's temporary allocation of a program (activations kept for the backward pass, gradients,
      optimizer intermediates);
  peak of a program = the whole training state + the program's other inputs (the rollout) + its outputs
      that do not alias a donated input + its temp; total = the larger of the two programs' peaks.

Largest batch (``largest_batch``): rows (prompt groups x group size) in multiples of the smallest batch
the mesh's batch axes and the micro-batches accept. Compiles at the given batch and at twice it fit
total = a + b x rows; the rows where that line reaches the memory limit are compiled next, and so on
(each estimate on the line through the last two compiled batches, kept strictly between the largest
batch that fits and the smallest that does not) until a compiled batch fits and the next multiple,
also compiled, does not. The answer is the compiler's, not an extrapolation, assuming the peak
grows with the batch. After ``MAX_COMPILES`` compiles the largest batch found to fit is
returned, marked unverified.

What it does not plan: the sampler (its KV cache and prefill activations), the host side, and a device
runtime's own reservations (a CUDA context, allocator fragmentation). The compile runs on this
process's devices: on a CPU-only machine, simulated CPU devices (``python -m pgjax.plan`` re-runs
itself with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` when the mesh needs more devices
than there are), so the figures are XLA:CPU's fusion and buffer assignment, which a GPU or TPU
compiler approximates but does not equal.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from pgjax import core, markdown
from pgjax.config import AlgorithmSection, ModelSection, UpdateConfig
from pgjax.models import hf
from pgjax.models.lora import LoRAConfig
from pgjax.models.transformer import REMAT_POLICIES, ModelConfig
from pgjax.parallel import mesh as mesh_lib
from pgjax.rollout.batch import Rollout, placeholder_rollout
from pgjax.train.memory import abstract_learner, human, placed, shard_bytes
from pgjax.train.packing import Packing, most_packed_rows
from pgjax.train.population import over_members

GIB = 2 ** 30
MAX_COMPILES = 8        # compiled batch sizes per largest-batch search, the two first probes included
CHILD = "PGJAX_PLAN_CHILD"      # set in the re-run with simulated devices (it must not re-run itself again)


@dataclasses.dataclass(frozen=True)
class Program:
    """XLA's memory analysis of one compiled program, bytes per device, and its compile time.
    ``argument``: the arguments it reads (jit drops unused ones: ``prepare`` reads no optimizer state);
    ``inputs``: its arguments that are not the training state (the rollout), from their shardings."""
    argument: int
    output: int
    alias: int
    temp: int
    inputs: int
    compile_s: float

    def peak(self, state: int) -> int:
        """The device's memory while the program runs: the resident training state, the other inputs,
        fresh outputs (those not written into donated inputs) and the temp."""
        return state + self.inputs + self.output - self.alias + self.temp


@dataclasses.dataclass(frozen=True)
class Plan:
    """Per-device bytes of one training step (``prepare`` then one optimizer step) at ``rows`` rows."""
    model: str
    options: dict                # the model's runtime options: dtypes, remat, scan_layers
    parameters_total: int        # the model's parameter count (not bytes, not per device)
    mesh: dict
    rows: int
    group_size: int
    prompt_len: int
    response_len: int
    micro_batches: int
    members: int                 # a population's members on these devices (pgjax.train.population); 1: a run
    params: int
    optimizer: int
    reference: int
    gradients: int
    state: int                   # the whole training state: the above but gradients, plus critic, step, key
    prepare: Program
    step: Program

    @property
    def total(self) -> int:
        """Peak bytes per device: the larger of the two programs' peaks."""
        return max(self.prepare.peak(self.state), self.step.peak(self.state))

    @property
    def peak_temp(self) -> int:
        """The temp of the program that sets ``total``."""
        return max((self.prepare, self.step), key=lambda p: p.peak(self.state)).temp

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "total": self.total, "peak_temp": self.peak_temp}


@dataclasses.dataclass(frozen=True)
class Fit:
    """The largest batch whose total fits ``limit`` bytes per device: ``rows`` (0: not even the smallest
    batch); ``verified``: ``rows`` was compiled and fits and ``rows + unit`` was compiled and does not;
    ``compiled``: {rows: total bytes} of every batch compiled in the search."""
    rows: int
    unit: int
    limit: int
    verified: bool
    compiled: dict


def load_model_config(path, **options) -> ModelConfig:
    """The ``ModelConfig`` of a Hugging Face config.json, or of a directory holding one, read offline;
    ``options``: ``hf.config_from_hf``'s (family, param_dtype, compute_dtype, remat, scan_layers)."""
    from transformers import AutoConfig
    path = pathlib.Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no model config at {path} (a config.json file, or a directory holding one)")
    return hf.config_from_hf(AutoConfig.from_pretrained(str(file), local_files_only=True), **options)


def parse_mesh(text: str) -> mesh_lib.MeshConfig:
    """``"data=2,fsdp=4"`` -> ``MeshConfig``; an axis not named takes ``MeshConfig``'s default (data
    -1 = the rest, fsdp and tensor 1)."""
    sizes = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key.strip() not in mesh_lib.MESH_AXES:
            raise ValueError(f"unknown mesh axis {key.strip()!r} in {text!r}; the axes are {mesh_lib.MESH_AXES}")
        try:
            sizes[key.strip()] = int(value)
        except ValueError:
            raise ValueError(f"mesh axis {key.strip()!r}: size {value!r} is not an integer") from None
    return mesh_lib.MeshConfig(**sizes)


def default_devices(mesh: mesh_lib.MeshConfig) -> int:
    """The devices a mesh describes: the product of its sizes, a -1 ("the rest") counted as 1."""
    return math.prod(abs(s) for s in (mesh.data, mesh.fsdp, mesh.tensor))


def batch_unit(mesh: jax.sharding.Mesh, group_size: int, micro_batches: int) -> int:
    """The smallest batch (rows) that is whole prompt groups, splits into ``micro_batches`` of whole
    groups, and whose micro-batches split over the mesh's ``data`` x ``fsdp`` devices."""
    shards = mesh_lib.batch_shards(mesh)
    return micro_batches * group_size * shards // math.gcd(group_size, shards)


def check_batch_arguments(rows: int, group_size: int, micro_batches: int, mesh) -> None:
    """A ValueError unless ``rows`` is whole groups that split into ``micro_batches`` and over the
    ``data`` x ``fsdp`` axes of ``mesh`` (a ``Mesh``, or an ``AbstractMesh`` before the devices exist)."""
    if group_size < 1:
        raise ValueError(f"--group-size must be >= 1, got {group_size}")
    unit = batch_unit(mesh, group_size, micro_batches)
    if rows < 1 or rows % group_size:
        raise ValueError(f"batch {rows} rows is not a positive number of whole groups of {group_size} "
                         f"(--group-size); the smallest valid batch here is {unit}")
    try:
        UpdateConfig(micro_batches=micro_batches).check(rows // group_size, group_size, mesh)
    except ValueError as error:
        raise ValueError(f"{error} (batches that split: multiples of {unit} rows)") from None


def _compiled(jitted, *args, inputs) -> Program:
    """Lower and compile ``jitted`` for ``args``; its memory analysis."""
    start = time.perf_counter()
    stats = jitted.lower(*args).compile().memory_analysis()
    return Program(stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.alias_size_in_bytes,
                   stats.temp_size_in_bytes, inputs, time.perf_counter() - start)


class Planner:
    """One model, mesh, algorithm and sequence shape: the Learner, built for abstract arrays once;
    ``plan(rows)`` compiles its programs at a batch size, ``largest_batch`` searches the batch."""

    def __init__(self, model: ModelConfig, mesh: mesh_lib.MeshConfig, prompt_len: int, response_len: int, *,
                 devices: int | None = None, algorithm: str | core.Estimator = "grpo", group_size: int = 8,
                 micro_batches: int = 1, pack_width: int = 0, reference: bool | None = None, name: str = "",
                 members: int = 1, vmap_width: int | None = None):
        """``devices``: the mesh's device count (default ``default_devices(mesh)``), at most this process's;
        ``algorithm``: a preset's name, the import path ``package.module:name`` of an estimator of your own
        (``experiment.AlgorithmSection.preset``) or an estimator object;
        ``reference``: keep a frozen reference policy (default: as the Trainer decides, when the estimator
        requires ``ref_logp``; False turns a preset's KL off); ``pack_width``: the update's ``update.pack_width``,
        planned at its most packed rows (``packing.most_packed_rows``); ``members``: plan a population's
        group of that many members on the mesh's devices (``pgjax.train.population``: each member's state
        and rollout stacked on a leading axis, the programs over them by ``population.over_members`` with
        ``vmap_width``, None: all vmapped, as on an accelerator); ``rows`` is then each member's batch."""
        if min(prompt_len, response_len) < 1:
            raise ValueError(f"prompt and response lengths must be >= 1, got {prompt_len} and {response_len}")
        if members < 1 or (vmap_width is not None and vmap_width < 1):
            raise ValueError(f"members={members} and vmap_width={vmap_width}: each >= 1")
        if pack_width and members > 1:
            raise ValueError("a population's update does not pack (pack_width must be 0 with members > 1)")
        self.members, self.vmap_width = members, members if vmap_width is None else min(vmap_width, members)
        devices = default_devices(mesh) if devices is None else devices
        self.mesh = mesh_lib.make_mesh(mesh, _devices(devices))
        self.algorithm = algorithm if isinstance(algorithm, core.Estimator) else AlgorithmSection(
            preset=algorithm).build()
        if group_size < max(1, self.algorithm.min_group_size):
            raise ValueError(f"group size {group_size}: {self.algorithm.name} needs at least "
                             f"{max(1, self.algorithm.min_group_size)}")
        self.reference = "ref_logp" in self.algorithm.requires if reference is None else reference
        self.hparams = self.algorithm.hparams
        if not self.reference and isinstance(self.algorithm, core.Algorithm):
            self.hparams = dataclasses.replace(self.hparams, kl_coef=0.0)
        self.model, self.name = model, name or f"{model.family} {model.num_hidden_layers} layers"
        self.prompt_len, self.response_len, self.group_size = prompt_len, response_len, group_size
        self.update = UpdateConfig(micro_batches=micro_batches, pack_width=pack_width)
        self.unit = batch_unit(self.mesh, group_size, micro_batches)
        self.learner, self.state = abstract_learner(model, self.algorithm, group_size, self.update, self.mesh,
                                                    self.reference)
        self._plans: dict[int, Plan] = {}

    def _stacked(self, tree):
        """A population's ``tree`` (with ``members`` > 1): each ShapeDtypeStruct with a leading member axis,
        unsplit, its other axes split as one member's."""
        if self.members == 1:
            return tree
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct((self.members, *x.shape), x.dtype, sharding=NamedSharding(
            self.mesh, PartitionSpec(None, *x.sharding.spec))), tree)

    def _programs(self):
        """(prepare, the optimizer step): the Learner's jitted programs, or for a population the same
        functions over the stacked members (``population.over_members``), the state donated."""
        learner = self.learner
        if self.members == 1:
            return learner.prepare, learner._optimizer_step
        over = partial(over_members, width=self.vmap_width, members=self.members)
        return (jax.jit(over(learner._prepare)),
                jax.jit(over(lambda state, rollout, order, hparams: learner._step(state, rollout, order, None, hparams,
                                                                                   None), carried=1), donate_argnums=0))

    def rollout(self, rows: int) -> Rollout:
        """The abstract rollout the sampler hands ``prepare`` (``rollout.batch.placeholder_rollout``: tokens,
        response mask, rewards, the sampler's log-probs, ReMax's greedy rewards), split over the batch axes."""
        sharding = mesh_lib.batch_sharding(self.mesh)
        return placeholder_rollout(rows, self.prompt_len, self.response_len, self.group_size,
                                   "greedy_rewards" in self.algorithm.requires,
                                   lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding))

    def plan(self, rows: int) -> Plan:
        """Compile ``prepare`` and the optimizer step at ``rows`` rows (cached per batch size)."""
        if rows not in self._plans:
            check_batch_arguments(rows, self.group_size, self.update.micro_batches, self.mesh)
            self._plans[rows] = self._plan(rows)
        return self._plans[rows]

    def state_bytes(self) -> dict:
        """Bytes one device holds of the training state (no compile): ``params``, ``optimizer``,
        ``reference``, ``gradients`` (the trainable parameters') and ``state`` (all of it); a
        population's, of all its ``members``."""
        state = self._stacked(self.state)
        return {"params": shard_bytes(state.params), "optimizer": shard_bytes(state.opt_state),
                "reference": shard_bytes(state.ref_params),
                "gradients": shard_bytes(self.learner.trainable(state.params)[0]), "state": shard_bytes(state)}

    def _plan(self, rows: int) -> Plan:
        learner, same = self.learner, mesh_lib.replicated(self.mesh)
        rollout = self.rollout(rows)
        prepared = placed(jax.eval_shape(learner.prepare, self.state, rollout, self.hparams),
                          mesh_lib.batch_sharding(self.mesh))
        order = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=same)      # the minibatch's rows: all of them
        state, rollout, prepared, order = self._stacked((self.state, rollout, prepared, order))
        hparams = self._stacked(jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.float32, sharding=same),
                                             self.hparams)) if self.members > 1 else self.hparams
        prepare_program, step_program = self._programs()
        prepare = _compiled(prepare_program, state, rollout, hparams, inputs=shard_bytes(rollout))
        packing = self._worst_packing(prepared) if learner.update_config.pack_width else None
        # a run's step: (..., packing, hparams, the LoRA-dropout key: None without dropout)
        arguments = (prepared, order, packing, hparams, None) if self.members == 1 else (prepared, order, hparams)
        step = _compiled(step_program, state, *arguments, inputs=shard_bytes((prepared, order, packing)))
        options = {name: getattr(self.model, name) for name in ("param_dtype", "compute_dtype", "remat", "scan_layers")}
        options["lora_rank"] = self.model.lora.rank if self.model.lora else 0
        return Plan(model=self.name, options=options,
                    parameters_total=sum(x.size for x in jax.tree.leaves(state.params)), mesh=dict(self.mesh.shape),
                    rows=rows, group_size=self.group_size, prompt_len=self.prompt_len,
                    response_len=self.response_len, micro_batches=self.update.micro_batches, members=self.members,
                    **self.state_bytes(),
                    prepare=prepare, step=step)

    def _worst_packing(self, prepared) -> Packing:
        """The abstract ``Packing`` of ``update.pack_width`` that needs the most memory
        (``packing.most_packed_rows`` per micro-batch)."""
        micro, factor, same = self.update.micro_batches, self.update.pack_width, mesh_lib.replicated(self.mesh)
        rows, width = prepared.tokens.shape
        packed_rows = most_packed_rows(rows // micro, factor, mesh_lib.batch_shards(self.mesh))
        packed = jax.ShapeDtypeStruct((micro, packed_rows, width * factor), jnp.int32, sharding=same)
        # abstract fields (ShapeDtypeStructs) of the Packing the update is lowered with, not arrays
        return Packing(tokens=packed, segment_ids=packed, predictors=jax.ShapeDtypeStruct(  # type: ignore[arg-type]
            (micro, rows // micro, prepared.mask.shape[1]), jnp.int32, sharding=same))

    def largest_batch(self, limit: int, start: int) -> Fit:
        """The largest batch (a multiple of ``unit`` rows) whose total fits ``limit`` bytes, searched from
        compiles at ``start`` and ``2 start`` rows as the module docstring says."""
        totals = {rows: self.plan(rows).total for rows in (start, 2 * start)}
        while True:
            low = max((rows for rows, total in totals.items() if total <= limit), default=0)
            high = min((rows for rows, total in totals.items() if total > limit), default=None)
            if high is not None and high - low <= self.unit:
                return Fit(low, self.unit, limit, True, totals)
            if len(totals) >= MAX_COMPILES:
                return Fit(low, self.unit, limit, False, totals)
            rows = _next_batch(totals, limit, self.unit, low, high)
            totals[rows] = self.plan(rows).total


def _next_batch(totals: dict, limit: int, unit: int, low: int, high: int | None) -> int:
    """The next batch to compile: where the line through the last two compiled batches reaches ``limit``
    (a secant step), rounded down to ``unit``, kept strictly between ``low`` (fits) and ``high`` (does
    not); where that line does not rise, twice the largest batch or the bracket's middle."""
    (r1, t1), (r2, t2) = list(totals.items())[-2:]
    if (t2 - t1) * (r2 - r1) > 0:
        guess = int((r1 + (limit - t1) * (r2 - r1) / (t2 - t1)) // unit) * unit
    else:
        guess = 2 * max(totals) if high is None else (low + high) // 2 // unit * unit
    guess = max(guess, low + unit)
    return guess if high is None else min(guess, high - unit)


def _devices(count: int) -> list:
    """The first ``count`` devices of this process; a ValueError when it has fewer."""
    if count < 1:
        raise ValueError(f"--devices must be >= 1, got {count}")
    if count > jax.device_count():
        raise ValueError(f"the mesh needs {count} devices and this process has {jax.device_count()}: run "
                         "`python -m pgjax.plan`, which re-runs itself on simulated CPU devices, or set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count={count} before JAX starts")
    return jax.devices()[:count]


def plan(model: ModelConfig, mesh: mesh_lib.MeshConfig, batch: int, prompt_len: int, response_len: int,
         **options) -> Plan:
    """Per-device memory of one training step at ``batch`` rows (``Planner``'s ``options``)."""
    return Planner(model, mesh, prompt_len, response_len, **options).plan(batch)


def summary(plan: Plan, limit: int, fit: Fit | None = None) -> list[str]:
    """The plan as printed lines, per device."""
    mesh = " x ".join(f"{axis}={size}" for axis, size in plan.mesh.items())
    lines = [f"{plan.model}, {plan.parameters_total:,} parameters; mesh {mesh}; {plan.rows} rows "
             f"({plan.rows // plan.group_size} prompts x {plan.group_size}) x ({plan.prompt_len} prompt + "
             f"{plan.response_len} response) tokens, {plan.micro_batches} micro-batch(es)"
             + (f"; a population of {plan.members} members on these devices, each with these rows"
                if plan.members > 1 else ""),
             "per device:",
             f"  parameters           {human(plan.params)}",
             f"  optimizer state      {human(plan.optimizer)}",
             f"  reference parameters {human(plan.reference)}",
             f"  gradients            {human(plan.gradients)} (inside the step's temp)"]
    if plan.state - plan.params - plan.optimizer - plan.reference > 2 ** 20:
        lines.append(f"  critic and the rest  {human(plan.state - plan.params - plan.optimizer - plan.reference)}")
    for name, program in (("prepare", plan.prepare), ("optimizer step", plan.step)):
        lines.append(f"  {name:20s} temp {human(program.temp)}, peak {human(program.peak(plan.state))} "
                     f"(compiled in {program.compile_s:.1f} s)")
    verdict = "fits" if plan.total <= limit else "does NOT fit"
    lines.append(f"  total peak           {human(plan.total)}: {verdict} in {human(limit)}")
    if fit is not None:
        lines.append(f"largest batch that fits {human(limit)}: {_largest(fit, plan.group_size)}"
                     + ("" if fit.verified else " (unverified: the search ran out of compiles)"))
    return lines


def _largest(fit: Fit, group_size: int) -> str:
    if not fit.rows:
        return "none" if fit.verified else f"none found in {len(fit.compiled)} compiles"
    return f"{fit.rows:,} rows ({fit.rows // group_size:,} prompts x {group_size})"


def result(plan: Plan, limit: int, fit: Fit | None = None) -> dict:
    """What ``--json`` saves of a plan and its search (JSON types), and what ``markdown_rows`` reads."""
    return {"plan": plan.as_dict(), "limit": limit, "fit": None if fit is None else dataclasses.asdict(fit)}


def markdown_rows(results: list[dict]) -> list[str]:
    """A markdown table of ``result`` dicts, one row each: GiB per device, the total at the compiled batch,
    and the largest batch found (rows; ``?``: unverified)."""
    header = ["model", "devices (data,fsdp,tensor)", "remat", "LoRA rank", "parameters", "Adam moments", "reference",
              "peak temp", "total (GiB) at batch (rows)", "largest batch (rows)"]
    return markdown.table(header, [_markdown_row(saved) for saved in results], align="lllrrrrrlr").splitlines()


def _markdown_row(saved: dict) -> list[object]:
    """``markdown_rows``' cells of one ``result`` dict."""
    plan, fit, limit = saved["plan"], saved["fit"], saved["limit"]
    sizes = plan["mesh"].values()
    gib = lambda key: f"{plan[key] / GIB:.2f}"     # noqa: E731
    verdict = "fits" if plan["total"] <= limit else "does not fit"
    largest = "-" if fit is None else f"{fit['rows']:,}" if fit["rows"] else "none"
    unverified = "" if fit is None or fit["verified"] else "?"
    return [plan["model"], f"{math.prod(sizes)} ({','.join(map(str, sizes))})", plan["options"]["remat"],
            plan["options"].get("lora_rank", 0) or "-", gib("params"), gib("optimizer"), gib("reference"),
            gib("peak_temp"), f"{gib('total')} at {plan['rows']}: {verdict}", f"{largest}{unverified}"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pgjax.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a Hugging Face config.json, or a directory holding one")
    p.add_argument("--family", default=None, help="read the config as a model family of your own: the import path "
                   "package.module:NAME of a pgjax.models.transformer.Family (model.family; default: the built-in "
                   "family of its model_type)")
    p.add_argument("--mesh", default="data=1", help="axis sizes, e.g. data=2,fsdp=4,tensor=1 (default data=1)")
    p.add_argument("--devices", type=int,
                   help="devices of the mesh (default: the product of its sizes, a -1 counting as 1)")
    p.add_argument("--batch", type=int, required=True, help="rows: prompt groups x group size")
    p.add_argument("--prompt-len", type=int, required=True)
    p.add_argument("--response-len", type=int, required=True)
    p.add_argument("--remat", choices=tuple(REMAT_POLICIES), default=ModelSection.remat,
                   help="default: a run's (model.remat)")
    p.add_argument("--scan-layers", action=argparse.BooleanOptionalAction, default=ModelSection.scan_layers,
                   help="default: a run's (model.scan_layers)")
    p.add_argument("--param-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--compute-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--lora", type=int, default=0, metavar="RANK",
                   help="LoRA adapters of this rank on every projection, alpha = 2 x rank (0: full fine-tuning)")
    p.add_argument("--algorithm", default="grpo", help="a preset of pgjax.core.PRESETS, or the import path "
                   "package.module:name of your own estimator")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--pack-width", type=int, default=0,
                   help="the update packs its sequences into rows this many rollout widths wide (0: no packing)")
    p.add_argument("--reference", action=argparse.BooleanOptionalAction, default=None,
                   help="keep a frozen reference policy (default: when the preset's KL term is on)")
    p.add_argument("--members", type=int, default=1,
                   help="plan a population of this many members on the mesh's devices (pgjax.train.population; "
                        "--batch: each member's rows)")
    p.add_argument("--vmap-width", type=int, default=None,
                   help="a population's members per vmapped computation (default: all, as on an accelerator)")
    p.add_argument("--device-memory-gib", type=float, default=80.0)
    p.add_argument("--search", action=argparse.BooleanOptionalAction, default=True,
                   help="search the largest batch that fits (a few more compiles)")
    p.add_argument("--json", help="also write the plan (and the search) to this file")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    try:
        model = load_model_config(args.model, param_dtype=args.param_dtype, compute_dtype=args.compute_dtype,
                                  remat=args.remat, scan_layers=args.scan_layers, family=args.family,
                                  lora=LoRAConfig(rank=args.lora, alpha=2.0 * args.lora) if args.lora else None)
        mesh = parse_mesh(args.mesh)
        devices = default_devices(mesh) if args.devices is None else args.devices
        sizes = mesh.sizes(devices)
        check_batch_arguments(args.batch, args.group_size, args.micro_batches,
                    jax.sharding.AbstractMesh(sizes, mesh_lib.MESH_AXES))
        if devices > jax.device_count() and CHILD not in os.environ:
            return _rerun_on_simulated_devices(argv, devices)
        path = pathlib.Path(args.model)
        name = path.name if path.is_dir() else path.parent.name if path.name == "config.json" else path.stem
        planner = Planner(model, mesh, args.prompt_len, args.response_len, devices=devices,
                          algorithm=args.algorithm, group_size=args.group_size, micro_batches=args.micro_batches,
                          pack_width=args.pack_width, reference=args.reference, name=name, members=args.members,
                          vmap_width=args.vmap_width)
    except (ValueError, FileNotFoundError, OSError) as error:
        parser().error(str(error))
    limit = int(args.device_memory_gib * GIB)
    planned = planner.plan(args.batch)
    fit = planner.largest_batch(limit, args.batch) if args.search else None
    print("\n".join(summary(planned, limit, fit)))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"argv": argv, **result(planned, limit, fit)}, indent=1))
    return 0


def _rerun_on_simulated_devices(argv: list[str], devices: int) -> int:
    """Run this command again in a process with ``devices`` simulated CPU devices (the XLA flag must be
    set before JAX starts); its exit status."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    env = {**os.environ, CHILD: "1", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])}
    return subprocess.run([sys.executable, "-m", "pgjax.plan", *argv], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
