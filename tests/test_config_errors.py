"""Configuration mistakes and run-time failures at the edges, each one plain line: sizes no machine
holds and models too large for this one (refused before anything is built, naming the estimate and
``python -m pgjax.plan``), running out of memory during the run, an experiment that is not a Python
file, a value of the wrong type inside a section's own checks, a truncated checkpoint, file names too
long, bytes that are not UTF-8 in a data file, ``sys.exit()`` in a reward function and waits longer
than a timer takes. Functions defined here are addressable as ``test_config_errors:NAME``."""
import os
import pathlib
import signal
import sys

import jax
import pytest
from helpers import save_tiny_checkpoint

from pgjax import config as config_lib
from pgjax import run
from pgjax.config import ConfigError
from pgjax.models import hf
from pgjax.parallel.mesh import make_mesh
from pgjax.tasks import RewardError, call_reward, with_timeout
from pgjax.tasks.data import load_jsonl
from pgjax.tasks.preferences import load_preferences
from pgjax.train import memory
from pgjax.train.trainer import Trainer

ROOT = pathlib.Path(__file__).parent.parent
MAIN_JOB = str(ROOT / "experiments" / "arithmetic_dr_grpo.py")
HUGE = 2 ** 40
GIB = 2 ** 30


def refused(capsys, tmp_path, monkeypatch, *argv, experiment=MAIN_JOB, status=2, kind="error") -> str:
    """Run the CLI in ``tmp_path``; assert ``status``, one line ``pgjax.run: {kind}: ...`` without a
    traceback and, for a refusal (status 2), nothing written; return the line."""
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert run.main([experiment, "--no-progress", *argv]) == status
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"pgjax.run: {kind}: ") and len(err.splitlines()) == 1, err
    if status == 2:
        assert sorted(tmp_path.rglob("*")) == before, "the CLI wrote to disk before refusing"
    return err


def experiment_file(tmp_path, body: str) -> str:
    """An experiment file whose ``experiment()`` returns ``body`` (with the sections imported)."""
    file = tmp_path / "exp" / "experiment.py"
    file.parent.mkdir()
    file.write_text("from pgjax.config import Experiment, RolloutConfig, TaskSection, WarmStartSection\n"
                    "from pgjax.config import OptimConfig\n\n"
                    f"def experiment():\n    return {body}\n")
    return str(file)


# ---------------------------------------------------------------- memory: refused before anything is built

@pytest.mark.parametrize("key", ["prompts_per_step", "rollout.samples_per_prompt", "rollout.max_new_tokens",
                                 "rollout.max_prompt_tokens", "eval_prompts", "warm_start.batch_size",
                                 "update.pack_width"])
def test_a_size_no_machine_holds_is_refused_naming_the_estimate_and_the_planner(key, capsys, tmp_path, monkeypatch):
    err = refused(capsys, tmp_path, monkeypatch, "--set", f"{key}={HUGE}")
    assert "pgjax.run: error: the run needs at least " in err and "more than this machine's" in err
    assert "python -m pgjax.plan" in err and f"{memory.SKIP_MEMORY_CHECK}=1 starts the run anyway" in err


@pytest.mark.parametrize("setting, part", [("model.hidden_size=1048576", "training state"),
                                           ("model.num_hidden_layers=100000", "training state")])
def test_a_model_larger_than_the_machine_is_refused_before_it_is_built(setting, part, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "host_memory", lambda: 16 * GIB)       # the same verdict on any test machine
    err = refused(capsys, tmp_path, monkeypatch, "--set", setting)
    assert "the run needs at least " in err and f"({part} " in err and "more than this machine's 16.00 GiB" in err


def test_the_memory_check_can_be_skipped_and_counts_a_device_of_its_own(monkeypatch):
    exp = config_lib.override(config_lib.load(MAIN_JOB), ["model.hidden_size=1048576"])
    mesh = make_mesh(exp.mesh)
    monkeypatch.setattr(memory, "host_memory", lambda: 16 * GIB)
    with pytest.raises(ConfigError, match="more than this machine's 16.00 GiB"):
        memory.check_memory(exp, mesh)
    monkeypatch.setenv(memory.SKIP_MEMORY_CHECK, "1")
    memory.check_memory(exp, mesh)
    monkeypatch.delenv(memory.SKIP_MEMORY_CHECK)
    monkeypatch.setattr(memory, "device_memory", lambda device: GIB)    # an accelerator of 1 GiB
    with pytest.raises(ConfigError, match=r"on a cpu device \(training state .*\), more than its 1.00 GiB"):
        memory.check_memory(exp, mesh)


@pytest.mark.parametrize("preset", ["dr_grpo", "ppo"])        # a critic's state grows with the layers too
def test_the_state_of_a_deep_model_is_its_shallow_states_extrapolated_exactly(preset):
    exp = config_lib.override(config_lib.load(MAIN_JOB), ["model.num_hidden_layers=3",
                                                                   f"algorithm.preset={preset}"])
    mesh, model = make_mesh(exp.mesh), exp.model.config(vocab_size=50)
    _, state = memory.abstract_learner(model, exp.algorithm.build(), 8, exp.update, mesh)
    assert memory.run_state_bytes(exp, model, mesh) == memory.shard_bytes(state)


# ---------------------------------------------------------------- memory: running out at run time

@pytest.mark.parametrize("error, line", [
    (jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 4398046511104 bytes."),
     "pgjax.run: stopped: out of cpu memory (XLA: RESOURCE_EXHAUSTED: Out of memory allocating 4398046511104 "
     "bytes.): python -m pgjax.plan plans a training step's memory per device; "),
    (ValueError("RESOURCE_EXHAUSTED: Out of memory allocating 3221225472 bytes."),      # as jax's dispatch raises it
     "pgjax.run: stopped: out of cpu memory (XLA: RESOURCE_EXHAUSTED: Out of memory allocating 3221225472 "
     "bytes.): python -m pgjax.plan plans a training step's memory per device; "),
    (MemoryError("Unable to allocate 8.00 TiB for an array with shape (1099511627776,) and data type int64"),
     "pgjax.run: stopped: out of host memory (Unable to allocate 8.00 TiB for an array with shape (1099511627776,) "
     "and data type int64): python -m pgjax.plan plans a training step's memory per device; "),
])
def test_running_out_of_memory_during_the_run_is_one_line_pointing_at_the_planner(error, line, capsys, tmp_path,
                                                                                   monkeypatch):
    def fit(self, *args):
        raise error
    monkeypatch.setattr(Trainer, "fit", fit)
    err = refused(capsys, tmp_path, monkeypatch, "--set", "warm_start.steps=0", "--set", "eval_prompts=8",
                  status=1, kind="stopped")
    assert err.startswith(line) and "more update.micro_batches" in err


def test_only_running_out_of_memory_is_read_as_such():
    assert memory.out_of_memory(RuntimeError("the word RESOURCE_EXHAUSTED")) is None
    assert memory.out_of_memory(jax.errors.JaxRuntimeError("INTERNAL: something else")) is None


# ---------------------------------------------------------------- the experiment file

@pytest.mark.parametrize("name", ["experiment.yaml", "experiment.json", "experiment"])
def test_an_experiment_that_is_not_a_python_file_is_one_line(name, capsys, tmp_path, monkeypatch):
    (tmp_path / name).write_text("name: x\nsteps: 10\n")
    err = refused(capsys, tmp_path, monkeypatch, experiment=str(tmp_path / name))
    assert err == (f"pgjax.run: error: {tmp_path / name} is not a Python file: an experiment is a .py file defining "
                   "experiment() returning a pgjax Experiment (experiments/ holds examples)")


@pytest.mark.parametrize("body, message", [
    ('Experiment(optim=OptimConfig(lr="1e-3"))', "OptimConfig.lr='1e-3' is invalid: a number is expected"),
    ('Experiment(warm_start=WarmStartSection(optim=OptimConfig(b1="0.9")))',
     "OptimConfig.b1='0.9' is invalid: a number is expected"),
    ('Experiment(rollout=RolloutConfig(samples_per_prompt="8"))',
     "rollout.samples_per_prompt='8' is invalid: an int is expected"),
])
def test_a_string_inside_a_sections_own_check_names_its_key_and_line(body, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    file = experiment_file(tmp_path, body)
    err = refused(capsys, tmp_path, monkeypatch, experiment=file)
    assert err == f"pgjax.run: error: exp/experiment.py:5: {message}"


# ---------------------------------------------------------------- checkpoints and run directories

@pytest.mark.parametrize("keep", [5, 0.5])
def test_a_truncated_checkpoint_is_one_line_naming_the_file(keep, capsys, tmp_path, monkeypatch):
    checkpoint = save_tiny_checkpoint(tmp_path / "checkpoint")
    weights = checkpoint / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:keep if isinstance(keep, int) else int(len(data) * keep)])
    with pytest.raises(ValueError, match=f"{weights} is not a whole safetensors file"):
        hf.load(checkpoint)
    err = refused(capsys, tmp_path, monkeypatch, "--set", f"model.path={checkpoint}")
    assert err.startswith(f"pgjax.run: error: model.path: {weights} is not a whole safetensors file (cut short or "
                          "damaged?): Error while deserializing header: ")


@pytest.mark.parametrize("key", ["run_dir", "name"])
def test_a_file_name_too_long_is_refused(key, capsys, tmp_path, monkeypatch):
    err = refused(capsys, tmp_path, monkeypatch, "--set", f"{key}={'r' * 300}")
    assert err.startswith(f"pgjax.run: error: {key}='rrrr") and "at most 200 bytes" in err


def test_a_run_dir_holding_a_nul_is_refused():
    with pytest.raises(ConfigError, match="run_dir='a\\\\x00b' is invalid: a path without NUL"):
        config_lib.override(config_lib.load(MAIN_JOB), ["run_dir=a\0b"])


# ---------------------------------------------------------------- data files

def test_a_byte_that_is_not_utf8_in_a_dataset_names_its_line(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"question": "1+1=", "answer": 2}\n\n{"question": "2+\xff=", "answer": 3}\n')
    with pytest.raises(ValueError, match=f"^{data}:3: not UTF-8 text: byte 0xff at column 17$"):
        load_jsonl(data)
    assert [r["answer"] for r in load_jsonl(data, skip_invalid=True)] == [2]


def test_a_byte_that_is_not_utf8_in_a_pairs_file_names_its_line(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_bytes(b'{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "\xc3(", "chosen": "b", '
                      b'"rejected": "c"}\n')
    with pytest.raises(ValueError, match=f"^{pairs}:2: not UTF-8 text: byte 0xc3 at column 13$"):
        load_preferences(pairs)


# ---------------------------------------------------------------- reward functions and timers

def exits(prompts, completions, **_):
    sys.exit()


def exits_with_3(prompts, completions, **_):
    sys.exit(3)


class Stop(BaseException):
    """A BaseException of the user's own."""


def raises_a_base_exception(prompts, completions, **_):
    raise Stop("halt")


def interrupts(prompts, completions, **_):
    raise KeyboardInterrupt


def line_of(fn) -> str:
    """``file:line`` of the first line of ``fn``'s body, as messages name it (the file relative to the
    working directory when it lies below it)."""
    relative = os.path.relpath(__file__)
    return f"{os.path.abspath(__file__) if relative.startswith('..') else relative}:{fn.__code__.co_firstlineno + 1}"


@pytest.mark.parametrize("fn, what", [(exits, "called sys.exit() (SystemExit), which would end the run"),
                                      (exits_with_3, "called sys.exit() (SystemExit: 3), which would end the run"),
                                      (raises_a_base_exception, "raised Stop: halt")])
def test_a_reward_function_that_exits_is_a_reward_error(fn, what):
    expected = f"reward function {fn.__name__} {what} ({line_of(fn)})"
    for scorer in (fn, with_timeout(fn, 5.0)):          # in the caller's thread and in a timed one
        with pytest.raises(RewardError) as error:
            call_reward(scorer, ["a"], ["b"])
        assert without_exit_hook(str(error.value)) == expected


def without_exit_hook(message: str) -> str:
    """``message`` as without wandb's exit hook: a test that ran ``wandb.init`` earlier in the same
    process leaves ``sys.exit`` replaced by one whose code defaults to 0, so ``sys.exit()`` raises
    ``SystemExit(0)``."""
    return message.replace("(SystemExit: 0)", "(SystemExit)")


def test_a_keyboard_interrupt_is_a_reward_error_only_where_ctrl_c_cannot_raise_one(monkeypatch):
    with pytest.raises(KeyboardInterrupt):          # Python's own SIGINT handler: it may be Ctrl-C
        call_reward(interrupts, ["a"], ["b"])
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.SIG_IGN)     # a run's handler, say
    with pytest.raises(RewardError, match="reward function interrupts raised KeyboardInterrupt"):
        call_reward(interrupts, ["a"], ["b"])


@pytest.mark.slow
def test_sys_exit_in_a_reward_function_stops_the_run_in_one_line_with_status_1(capsys, tmp_path, monkeypatch):
    file = tmp_path / "faulty.py"
    file.write_text("import pathlib\nfrom helpers import EMIT_X, tiny_experiment\n\ndef experiment():\n"
                    f"    return tiny_experiment(pathlib.Path({str(tmp_path)!r}), task=EMIT_X)\n")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    err = refused(capsys, tmp_path, monkeypatch, "--set", "task.reward.function=test_config_errors:exits",
                  experiment=str(file), status=1, kind="stopped")
    assert without_exit_hook(err) == (f"pgjax.run: stopped: step 1: reward function exits called sys.exit() "
                                      f"(SystemExit), which would end the run ({line_of(exits)})")
    assert not (tmp_path / "run" / "final").exists()


@pytest.mark.parametrize("argv, line", [
    (["--grace-period", "inf"], "pgjax.run: error: --grace-period=inf is invalid: seconds >= 0, at most {max}"),
    (["--grace-period", "1e300"], "pgjax.run: error: --grace-period=1e+300 is invalid: seconds >= 0, at most {max}"),
    (["--set", "task.reward.timeout=1e300"], "pgjax.run: error: task.reward.timeout=1e+300 is invalid: finite "
                                             "seconds >= 0 (0: no limit), at most {max}"),
])
def test_a_wait_longer_than_a_timer_takes_is_refused(argv, line, capsys, tmp_path, monkeypatch):
    """The limit is ``threading.TIMEOUT_MAX`` (9223372036 s on Linux): a longer wait overflows."""
    assert refused(capsys, tmp_path, monkeypatch, *argv) == line.format(max=f"{config_lib.MAX_SECONDS:.0f}")
