"""Helpers shared by the test modules (fixtures live in conftest.py): random batches whose log-probs are
a function of parameters, the tiny experiment / learner / rollout the training tests build on, the
EmitX toy task, simulated devices for subprocesses, and readers of what a run writes (TensorBoard
scalars and texts, an offline W&B run's history).

Import them with ``from helpers import ...`` (pytest puts tests/ on sys.path; a subprocess started by
a test puts it there itself). Nothing here compiles at import time."""
import dataclasses
import hashlib
import importlib.util
import itertools
import json
import math
import os
import pathlib
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pgjax import core
from pgjax.agents import Step
from pgjax.config import Experiment, ModelSection, OptimConfig, TaskSection, WarmStartSection
from pgjax.core import Batch, token_logprobs
from pgjax.models import hf
from pgjax.models.transformer import CausalLM, ModelConfig
from pgjax.rollout.batch import Rollout
from pgjax.rollout.collect import RolloutConfig, encode_prompts
from pgjax.sample import SamplingConfig, generate
from pgjax.tasks import char_tokenizer, per_example
from pgjax.train.learner import Learner
from pgjax.train.optim import make_optimizer
from pgjax.train.records import COST_KEYS
from pgjax.train.trainer import Callback

# ---------------------------------------------------------------- simulated devices (subprocesses)

# What XLA's CPU runtime prints when it gives up on a collective whose participants never all arrived.
XLA_COLLECTIVE_HANG = "Termination timeout for"


def fake_commands(calls: list, trained, evaluated):
    """A stand-in for ``subprocess.run`` in the study scripts' tests: each ``python -m pgjax.run`` /
    ``pgjax.eval`` command is appended to ``calls`` (without ``python -m``) and handed to
    ``trained(run_dir, command)`` / ``evaluated(command)``, which write what the real one would; any
    other command (matplotlib's fc-list, say) really runs."""
    real_run = subprocess.run

    def run(command, check, **options):
        if command[:2] != [sys.executable, "-m"]:
            return real_run(command, check=check, **options)
        calls.append(command[2:])
        if command[2] == "pgjax.run":
            directory = pathlib.Path(next(a for a in command if a.startswith("run_dir=")).split("=", 1)[1])
            trained(directory, command)
        else:
            evaluated(command)
    return run


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported as a module (``load_script``)."""
    return load_script("benchmarks", name)


def load_experiment_script(name: str):
    """``experiments/scripts/<name>.py`` (a standalone script) or ``experiments/studies/<name>.py`` (a study)
    imported as a module (``load_script``)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    folder = next(f for f in ("experiments/scripts", "experiments/studies") if (root / f / f"{name}.py").exists())
    return load_script(folder, name)


def load_script(folder: str, name: str):
    """``<folder>/<name>.py`` of the repository imported as a module, its folder on ``sys.path`` while
    it loads (for the sibling modules it imports)."""
    folder = pathlib.Path(__file__).resolve().parents[1] / folder
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


# How every test process (conftest.py) and subprocess compiles: a new machine's suite is mostly XLA
# compiling tiny programs, so code generation is made cheap, which tiny programs do not feel: LLVM at -O0,
# fusions emitted by XLA:CPU's elemental emitter rather than its MLIR fusion emitters, and each program's
# LLVM module compiled whole rather than split for threads the busy workers do not have. The HLO passes
# are a default build's but for lone reductions, gathers and scatters left unwrapped (docs/contributing.md).
FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
                " --xla_cpu_parallel_codegen_split_count=1")


def simulated_devices(count: int) -> str:
    """XLA_FLAGS for ``count`` simulated CPU devices. On this 2-core machine an 8-device program now
    and then never completes a collective (seen in the sampler's while loop on a 2x2x2 mesh: the
    devices wait in different collectives; XLA aborts after 40 s by default, and a 10-minute limit
    hung just the same), so the wait is cut at 120 s and the caller may retry (``XLA_COLLECTIVE_HANG``)."""
    return (f"--xla_force_host_platform_device_count={count} --xla_cpu_collective_call_terminate_timeout_seconds=120"
            f" --xla_cpu_collective_call_warn_stuck_timeout_seconds=60 {FAST_COMPILE}")


# ---------------------------------------------------------------- random batches and gradient trees

VOCAB = 5


def make_batch(seed: int, prompts: int = 3, group_size: int = 4, length: int = 6, *, dtype=jnp.float32):
    """A batch of P * K rows with varied response lengths (one empty response, one full,
    i.e. truncated), binary rewards with one all-equal group, and behaviour / reference
    log-probs near the current ones so that some tokens are clipped.

    Returns ``(batch, theta, tokens)``; ``batch.logp == token_logprobs(theta, tokens)``.
    """
    rng = np.random.default_rng(seed)
    b = prompts * group_size
    lengths = rng.integers(1, length + 1, size=b)
    lengths[0], lengths[1] = 0, length
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float64)
    rewards = rng.integers(0, 2, size=b).astype(np.float64)
    rewards[group_size:2 * group_size] = 1.0  # prompt 1: every sample correct
    theta = rng.normal(size=(b, length, VOCAB))
    tokens = rng.integers(0, VOCAB, size=(b, length))
    theta, tokens = jnp.asarray(theta, dtype), jnp.asarray(tokens)
    logp = token_logprobs(theta, tokens)
    noise = lambda scale: jnp.asarray(rng.normal(scale=scale, size=(b, length)), dtype)  # noqa: E731
    batch = Batch(mask=jnp.asarray(mask, dtype), rewards=jnp.asarray(rewards, dtype), logp=logp,
                  old_logp=logp + noise(0.3), ref_logp=logp + noise(0.2),
                  values=noise(1.0), bootstrap=jnp.asarray(np.where(lengths == length, 0.5, 0.0), dtype),
                  greedy_rewards=jnp.asarray(rng.integers(0, 2, size=b), dtype), group_size=group_size)
    return batch, theta, tokens


def per_layer(grads, config) -> dict:
    """{(layer, name): array} of a gradient tree, stacked (``scan_layers``) or one subtree per layer."""
    flat = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(grads)):
        keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
        if keys[0] == "layers" and config.scan_layers:
            flat.update(((i, tuple(keys[1:])), leaf[i]) for i in range(config.num_hidden_layers))
        elif keys[0] == "layers":
            flat[(keys[1], tuple(keys[2:]))] = leaf
        else:
            flat[(None, tuple(keys))] = leaf
    return flat


# ---------------------------------------------------------------- the toy task and the tiny experiment

TINY_MODEL = ModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16)


@per_example
def starts_with_x(prompt, completion, **_):
    return float(completion.startswith("x"))


@dataclasses.dataclass(frozen=True)
class EmitX:
    """Reward 1 for a response whose first token is ``x``."""
    name: str = "emit_x"
    format_pattern: str = "[abx]*"
    reward_fn = staticmethod(starts_with_x)

    def tokenizer(self):
        return char_tokenizer("abx")

    def examples(self, n, seed=0):
        return [{"prompt": "ab", "answer": "x"} for _ in range(n)]


EMIT_X = TaskSection(name="helpers:EmitX")      # a user's task, by import path (tests/ is on sys.path)


class XGame:
    """Two turns: a reply that opens with x earns 0.5 in the first turn and 1 in the second, which ends
    the episode; between them the environment says ``b``."""

    def reset(self, example):
        self.turn = 0
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, reply):
        self.turn += 1
        hit = float(reply.startswith("x"))
        if self.turn == 1:
            return Step(observation=[{"role": "user", "content": "b"}], reward=0.5 * hit)
        return Step(reward=hit, done=True, info={"correct": hit})


class OneTurnX:
    """EmitX as an environment: one reply, scored as EmitX's verifier scores it."""

    def reset(self, example):
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, reply):
        hit = float(reply.startswith("x"))
        return Step(reward=hit, done=True, info={"correct": hit})


@dataclasses.dataclass(frozen=True)
class EmitXGame(EmitX):
    """EmitX played as ``XGame`` episodes."""
    environment = XGame


@dataclasses.dataclass(frozen=True)
class EmitXOneTurn(EmitX):
    """EmitX played as one-turn episodes (``OneTurnX``)."""
    environment = OneTurnX


class FlakyXGame(XGame):
    """XGame whose step raises on a reply that opens with ``b`` (a bug the policy's replies find)."""

    def step(self, reply):
        if reply.startswith("b"):
            raise KeyError("b")
        return super().step(reply)


class BrokenXGame(XGame):
    """XGame whose step raises on every reply."""

    def step(self, reply):
        raise RuntimeError("the environment is broken")


class UnopenedXGame(XGame):
    """XGame whose reset raises."""

    def reset(self, example):
        raise LookupError(f"no game for {example['prompt']!r}")


@dataclasses.dataclass(frozen=True)
class EmitXUnopened(EmitX):
    """EmitX played as ``UnopenedXGame`` episodes."""
    environment = UnopenedXGame


@dataclasses.dataclass(frozen=True)
class EmitXFlaky(EmitX):
    """EmitX played as ``FlakyXGame`` episodes."""
    environment = FlakyXGame


@dataclasses.dataclass(frozen=True)
class EmitXBroken(EmitX):
    """EmitX played as ``BrokenXGame`` episodes."""
    environment = BrokenXGame


TOOL_ALPHABET = "0123456789+-*/^()[]=<>.:,;'?!_ abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n"


@dataclasses.dataclass(frozen=True)
class SumWithCalculator:
    """Sums of two digits (``"3+4"`` -> ``"7"``) for episodes with ``task.tools.names=calculator``: each
    example's worked episode calls the calculator on the sum (``tool_calls``), then answers its result."""
    name: str = "sum_with_calculator"
    format_pattern: str = r"-?\d+"
    reward_fn = staticmethod(per_example(lambda prompt, completion, *, target, **_:
                                         float(completion.strip() == str(target))))

    def tokenizer(self):
        return char_tokenizer(TOOL_ALPHABET)

    def examples(self, n, seed=0):
        pairs = np.random.default_rng(seed).integers(0, 10, size=(n, 2))
        return [{"prompt": f"{a}+{b}", "answer": str(a + b), "target": int(a + b),
                 "tool_calls": [{"name": "calculator", "arguments": f"{a}+{b}"}]} for a, b in pairs]


def p_first_x(policy, tokenizer) -> float:
    tokens, mask = encode_prompts(tokenizer, ["ab"], 4)
    logits = policy(jnp.asarray(tokens), jnp.asarray(mask))[0, -1]
    return float(jax.nn.softmax(logits)[tokenizer.convert_tokens_to_ids("x")])


def tiny_experiment(tmp_path, **changes) -> Experiment:
    base = Experiment(name="t", steps=4, prompts_per_step=4, model=TINY_MODEL, eval_every=2, eval_prompts=8,
                      checkpoint_every=2, run_dir=str(tmp_path / "run"), optim=OptimConfig(lr=1e-2),
                      critic_optim=OptimConfig(lr=1e-2), warm_start=WarmStartSection(steps=0),
                      rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=4, max_new_tokens=3))
    return dataclasses.replace(base, **changes)


def tiny_learner(algorithm, update, group_size=4, optimizer=None):
    config = ModelConfig(family="qwen2", vocab_size=12, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    policy = CausalLM(config, nnx.Rngs(0))
    algo = core.preset(algorithm)
    optimizer = optimizer or make_optimizer(OptimConfig(lr=1e-2))
    learner = Learner(policy, algo, group_size, update, optimizer, optimizer, use_reference=False)
    return policy, algo, learner


def sampled_rollout(policy, group_size=4, prompts=4):
    tokens = np.tile(np.arange(2, 6), (prompts, 1))
    samples = generate(policy, tokens, np.ones_like(tokens), jax.random.key(0),
                       SamplingConfig(max_new_tokens=5, eos_ids=(1,), n=group_size))
    rewards = jnp.asarray((np.asarray(samples.response) == 7).sum(1), jnp.float32)
    return Rollout(tokens=samples.tokens, attention_mask=samples.attention_mask,
                   batch=core.Batch(mask=samples.response_mask, rewards=rewards, logp=None, group_size=group_size))


# ---------------------------------------------------------------- what a run writes

def comparable(path) -> list[dict]:
    """The metric lines without wall-clock timings."""
    records = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in COST_KEYS} for r in records]


def read_events(directory) -> dict:
    """{tag: {step: value}} of the TensorBoard event files in ``directory`` (tensorboard's own reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def read_texts(directory) -> dict:
    """{tag: [(step, text), ...]} of the TensorBoard text summaries in ``directory``, every event
    kept, as TensorBoard's server reads them (its plugin event reader, which drops what a resumed
    run purged; the older reader of ``read_events`` purges scalars only)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    events = EventAccumulator(str(directory), size_guidance={"tensors": 0})
    events.Reload()
    return {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"] if events.SummaryMetadata(tag).plugin_data.plugin_name == "text"}


def wandb_records(data: bytes) -> list:
    """The protobuf Records of an offline W&B run file's bytes: LevelDB-style log blocks of 32 KiB, each
    record a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last; 0 a zeroed rest of
    the block) after the file's own 7-byte header (':W&B', version)."""
    from wandb.proto import wandb_internal_pb2
    position, pending, records = 7, b"", []
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if position + 7 + length > len(data):           # a record still being written
            break
        chunk, position = data[position + 7:position + 7 + length], position + 7 + length
        if kind == 0:                                   # a zeroed rest of a block: the next block goes on
            position += -position % 32768
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def read_wandb_history(path, timeout: float = 60.0) -> list[dict]:
    """The history rows of the offline W&B run file ``path``, once it is complete. ``run.finish()``
    returns before wandb's service process has written the last records of the file, so a reader in
    the same process waits (up to ``timeout`` seconds) for its ``exit`` record."""
    from google.protobuf.message import DecodeError
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = wandb_records(pathlib.Path(path).read_bytes())
        except DecodeError:                             # a block caught half-written: read it again
            records = []
        if any(record.WhichOneof("record_type") == "exit" for record in records):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} has no exit record {timeout:g} s after the run finished")
        time.sleep(0.1)
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for record in records if record.WhichOneof("record_type") == "history"]


# ---------------------------------------------------------------- Hugging Face checkpoints (transformers)

def tiny_hf_config(family, tied):
    import transformers
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied, rms_norm_eps=1e-6)
    if family == "llama":
        return transformers.LlamaConfig(**common, rope_scaling=LLAMA3_SCALING, rope_theta=500000.0)
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "gemma3":
        return transformers.Gemma3TextConfig(**{**common, "num_hidden_layers": 3}, **GEMMA3_TINY)
    return transformers.Qwen3Config(**common, head_dim=16)


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}
# a local, a global and a local layer; a window of 4 slots (the tests' sequences are longer); different RoPE
# bases, the global one scaled linearly; a query scale that is not head_dim
GEMMA3_TINY = dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})


def save_tiny_checkpoint(directory, chat_template=None) -> pathlib.Path:
    """A tiny Qwen2 Hugging Face checkpoint (one layer, 64 ids, random weights of seed 0) with
    ``save_tiny_tokenizer``'s tokenizer in ``directory``."""
    config = ModelConfig(family="qwen2", vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    hf.save(CausalLM(config, nnx.Rngs(0)), directory)
    save_tiny_tokenizer(directory, chat_template)
    return pathlib.Path(directory)


def save_tiny_tokenizer(directory, chat_template=None):
    """A character-level tokenizer built offline (tokenizers + transformers), 64 ids, <eos> = 1,
    with ``chat_template`` (a string, or a dict of named templates) if given."""
    import pytest
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    chars = "0123456789+-*= abcdefghijklmnopqrstuvwxyz"
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    vocab.update({f"<extra{i}>": i for i in range(len(vocab), 64)})
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    tokenizer.decoder = tokenizers.decoders.Fuse()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<pad>")
    fast.chat_template = chat_template
    fast.save_pretrained(directory)


# ---------------------------------------------------------------- faults (test_faults, test_run_dir_faults)

def experiment_file(tmp_path, **changes) -> pathlib.Path:
    """An experiment file for the command line: ``tiny_experiment`` on the EmitX task."""
    file = tmp_path / "faulty.py"
    extra = "".join(f", {k}={v}" for k, v in changes.items())
    file.write_text("import pathlib\nfrom helpers import EMIT_X, tiny_experiment\n"
                    "from pgjax.config import OptimConfig, UpdateConfig\n\n"
                    "def experiment():\n"
                    f"    return tiny_experiment(pathlib.Path({str(tmp_path)!r}), task=EMIT_X{extra})\n")
    return file


def snapshot(directory: pathlib.Path) -> dict:
    """Every file under ``directory`` (but the lock's note of its last holder) with a hash of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != ".lock"}


def copy_of(finished, tmp_path) -> tuple:
    exp, directory = finished[:2]
    shutil.copytree(directory, tmp_path / "run")
    return dataclasses.replace(exp, run_dir=str(tmp_path / "run")), tmp_path / "run"


class SignalAt(Callback):
    """Sends this process ``signum`` after step ``step``."""

    def __init__(self, signum, step):
        self.signum, self.step = signum, step

    def after_step(self, trainer, record):
        if record["step"] == self.step:
            signal.raise_signal(self.signum)


# Slow reference statistics (tests/test_statistics.py, tests/test_eval.py)

def slow_bootstrap_means(column, resamples: int, seed: int) -> list[float]:
    """Each resample's mean by a Python loop, from the same draws as ``bootstrap_means`` documents."""
    idx = np.random.default_rng(seed).integers(0, len(column), size=(resamples, len(column)))
    return [math.fsum(float(column[i]) for i in row) / len(column) for row in idx]


def hand_percentile(values, q: float) -> float:
    """The q-th percentile by sorting and interpolating linearly between the order statistics."""
    ordered = sorted(values)
    position = q / 100 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def enumerated_sign_flip_p(differences) -> Fraction:
    """P(|sum s_i d_i| >= |sum d_i|) counted over every one of the 2^P sign vectors."""
    observed = abs(sum(differences))
    signs = list(itertools.product((1, -1), repeat=len(differences)))
    hits = sum(abs(sum(s * d for s, d in zip(flip, differences, strict=True))) >= observed for flip in signs)
    return Fraction(hits, len(signs))


# Plots

def assert_plotted(path) -> None:
    """``path`` is a PNG on which data were drawn: more than 50 pixels in the colours of matplotlib's cycle
    (C0 to C9, within 8/255), which axes, ticks, labels and a white background never use. A figure with
    empty axes fails, where a file-size check would pass. (Series drawn over one another, as curves that
    all sit at 0 are, count as drawn: the colour on top is counted.)"""
    import matplotlib.image
    from matplotlib import colors
    pixels = matplotlib.image.imread(path)[..., :3]
    cycle = np.asarray([colors.to_rgb(f"C{i}") for i in range(10)])
    drawn = int((np.abs(pixels[..., None, :] - cycle).max(-1) < 8 / 255).any(-1).sum())
    assert drawn > 50, f"{path}: {drawn} pixels in the colours of matplotlib's cycle: no data drawn"


# Faults: what a run leaves on disk (test_faults, test_checkpoints, test_run_dir, test_lora)

def assert_no_nan_on_disk(directory: pathlib.Path) -> None:
    """No metrics line, record or experiment file holds a bare NaN / Infinity."""
    for path in [directory / "metrics.jsonl", *directory.glob("checkpoints/*/record/metadata")]:
        if path.is_file():
            for line in path.read_text().splitlines():
                json.loads(line, parse_constant=lambda c, path=path: pytest.fail(f"{path} holds {c}"))


def finite_tree(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact))


def assert_same_tree(a, b) -> None:
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(a), jax.device_get(b))





def plain_mode() -> int:
    """The mode a plain file write gives here: 0666 less the umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def file_modes(folder: pathlib.Path) -> dict[str, int]:
    """``{relative path: permission bits}`` of every file under ``folder``."""
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in sorted(folder.rglob("*"))
            if p.is_file()}


def always_nan(prompts, completions, **_):
    return np.full(len(completions), np.nan)


def dataset_experiment(tmp_path, checkpoint_dir, lines, **options):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(line + "\n" for line in lines))
    return tiny_experiment(tmp_path, model=ModelSection(path=str(checkpoint_dir)),
                           task=TaskSection(name="jsonl_math", options={"path": str(data), **options}))


GOOD = [json.dumps({"question": f"{a}+1=", "answer": a + 1}) for a in range(6)]


def damage(path: pathlib.Path, kind: str) -> None:
    data = path.read_bytes()
    if kind == "flip":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1:])
    elif kind == "truncate":
        path.write_bytes(data[:len(data) // 2])
    else:
        path.unlink()
