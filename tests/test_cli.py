"""The command line treats a user's mistake as an error, not a crash: each class of bad input exits
with status 2 and one or two plain lines naming the key, the value and what is valid, prints no
traceback, and writes nothing to disk. ``CASES`` (``--set`` mistakes) and ``FILE_CASES`` (mistakes in an
experiment file) are the record of the mistakes covered."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
from helpers import tiny_hf_config

from pgjax import config as config_lib
from pgjax import run

ROOT = pathlib.Path(__file__).parent.parent
MAIN_JOB = str(ROOT / "experiments" / "arithmetic_dr_grpo.py")
GRPO = str(ROOT / "experiments" / "arithmetic_grpo.py")


def fails(capsys, tmp_path, monkeypatch, *argv, experiment=MAIN_JOB) -> str:
    """Run the CLI in ``tmp_path`` (default run directory runs/<name> there); assert exit status 2, a
    one-or-two-line message without a traceback, and nothing written; return the message."""
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert run.main([experiment, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pgjax.run: error: ") and 1 <= len(err.splitlines()) <= 2, err
    assert "Traceback" not in err
    assert sorted(tmp_path.rglob("*")) == before, "the CLI wrote to disk before refusing"
    return err


CASES = {
    "unknown key, with a suggestion": (["--set", "rollout.temprature=0.7"],
                                       "unknown config key 'rollout.temprature'; did you mean rollout.temperature?"),
    "key=value syntax": (["--set", "steps"], "--set expects key=value, got 'steps'"),
    "wrong type": (["--set", "prompts_per_step=lots"], "prompts_per_step='lots' is invalid: an int is expected"),
    "negative steps": (["--set", "steps=-5"], "steps=-5 is invalid: an integer >= 0"),
    "zero batch": (["--set", "prompts_per_step=0"], "prompts_per_step=0 is invalid: an integer >= 1"),
    "non-positive learning rate": (["--set", "optim.lr=0"], "optim.lr=0.0 is invalid: a finite number > 0"),
    "bad hyperparameter": (["--set", "algorithm.hparams.clip_eps_low=1.5"],
                           "hyperparameter clip_eps_low=1.5 must be in [0, 1)"),
    "unknown algorithm": (["--set", "algorithm.preset=trpo"], "algorithm.preset='trpo' is invalid: one of reinforce"),
    "a renamed key": (["--set", "hparams.kl_coef=0.01"], "did you mean algorithm.hparams.kl_coef?"),
    "a key cut short": (["--set", "rollout.temp=0.5"], "did you mean rollout.temperature?"),
    "the old algorithm key": (["--set", "algorithm=grpo"], "did you mean algorithm.preset?"),
    "unknown task": (["--set", "task.name=sudoku"], "task.name='sudoku' is unknown; valid: arithmetic"),
    "micro-batches that do not divide": (["--set", "update.micro_batches=3"],
                                         "32 prompt groups per step (prompts_per_step) do not split into "
                                         "update.minibatches=1 x update.micro_batches=3"),
    "missing model": (["--set", "model.path=/no/such/checkpoint"],
                      "model.path='/no/such/checkpoint': no Hugging Face checkpoint there"),
    "missing dataset": (["--set", "task.name=jsonl_math", "--set", "task.options.path=/no/such.jsonl"],
                        "task.options.path='/no/such.jsonl': no such dataset file"),
    "negative seed": (["--set", "seed=-1"], "seed=-1 is invalid: an integer in [0, 2**32)"),
    "prompts longer than the prompt budget": (["--set", "rollout.max_prompt_tokens=3"],
                                              "rollout.max_prompt_tokens=3: prompts must have 1..3 tokens"),
    "demonstrations longer than the response budget": (["--set", "rollout.max_new_tokens=2"],
                                                       "rollout.max_new_tokens=2: demonstration"),
    "a mesh that does not fit the devices": (["--set", "mesh.data=3"], "mesh: mesh {'data': 3, 'fsdp': 1, 'tensor': 1} "
                                                                       "needs 3 devices, 1 are present"),
    "a sampler that leaves the learner no device": (["--set", "rollout.sampler_devices=1"],
                                                    "mesh, rollout.sampler_devices: sampler_devices=1 must leave "
                                                    "the learner at least one of the 1 devices"),
    "a KL coefficient where there is no KL term": (["--set", "algorithm.hparams.kl_coef=0.01"],
                                                   "hparams.kl_coef=0.01 does nothing for dr_grpo"),
    "sampling and scoring temperatures that differ": (["--set", "rollout.temperature=0.8"],
                                                      "update.temperature=1.0 differs from rollout.temperature=0.8"),
    "a task option the task does not take": (["--set", "task.options.count=4"],
                                             "task.options.count=4 does nothing for task 'arithmetic', which takes "
                                             "digits, ops"),
    "a reward that is not a function": (["--set", "task.reward.function=pgjax.tasks:TASKS"], "is not callable"),
    "distributed ids out of range": (["--set", "distributed.num_processes=2", "--set", "distributed.process_id=2"],
                                     "distributed.process_id=2 "
                                     "is invalid: in [0, num_processes=2), or -1 (from the environment)"),
    "resume with nothing to resume": (["--resume"], "--resume: no checkpoint to resume in runs/arithmetic_dr_grpo"),
    # seeds: jax.random.PRNGKey keeps 32 bits (2**32 would be seed 0) and overflows from 2**63
    "a seed of 2**32": (["--set", f"seed={2**32}"], "seed=4294967296 is invalid: an integer in [0, 2**32)"),
    "a seed of 2**63": (["--set", f"seed={2**63}"], "seed=9223372036854775808 is invalid: an integer in [0, 2**32)"),
    "a seed of 2**64": (["--set", f"seed={2**64}"], "seed=18446744073709551616 is invalid: an integer in [0, 2**32)"),
    "a float for an int": (["--set", "steps=1e3"], "steps='1e3' is invalid: an int is expected"),
    "a bool that is not one": (["--set", "logging.tensorboard=yes"], "logging.tensorboard='yes' is invalid: a bool"),
    # the run's name is its directory, runs/<name>
    "an empty name": (["--set", "name="], "name='' is invalid: a non-empty name without '/'"),
    "the name ..": (["--set", "name=.."], "name='..' is invalid: a non-empty name without '/', other than '.'"),
    "the name .": (["--set", "name=."], "name='.' is invalid"),
    # model
    "model.path is a file": (["--set", "model.path={files}/a_file"], "a_file': no Hugging Face checkpoint there"),
    "model.path with a broken config.json": (["--set", "model.path={files}/broken_json"],
                                             "broken_json/config.json is not a readable JSON file: Expecting property"),
    "model.path with a config.json that is not an object": (["--set", "model.path={files}/list_json"],
                                                            "list_json/config.json holds list, not a JSON object"),
    "model.path with a config.json that is not text": (["--set", "model.path={files}/binary_json"],
                                                       "binary_json/config.json is not a readable JSON file: 'utf-8'"),
    "model.path whose config.json is a directory": (["--set", "model.path={files}/json_directory"],
                                                    "no Hugging Face checkpoint there (config.json missing)"),
    "model.path without a model_type": (["--set", "model.path={files}/no_model_type"],
                                        "model.path: Unrecognized model in"),
    "model.path of an unsupported architecture": (["--set", "model.path={files}/gpt2"],
                                                  "model.path: unsupported architecture 'gpt2'"),
    "model.path without weights": (["--set", "model.path={files}/no_weights"], "model.path: no *.safetensors weights"),
    "an unknown model family": (["--set", "model.family=gpt2"], "model.family='gpt2' is invalid: one of"),
    "a zero hidden size": (["--set", "model.hidden_size=0"], "model.hidden_size=0 is invalid: an integer >= 1"),
    "heads that kv heads do not divide": (["--set", "model.num_attention_heads=3"],
                                          "model.num_key_value_heads=2 is invalid: a divisor of num_attention_heads=3"),
    "kv heads that do not divide the heads": (["--set", "model.num_key_value_heads=3"],
                                              "model.num_key_value_heads=3 is invalid: a divisor"),
    "an unknown param dtype": (["--set", "model.param_dtype=float8"], "model.param_dtype='float8' is invalid"),
    "an unknown remat policy": (["--set", "model.remat=yes"], "model.remat='yes' is invalid"),
    "a zero rms eps": (["--set", "model.rms_norm_eps=0"], "model.rms_norm_eps=0.0 is invalid: > 0"),
    "a negative rope theta": (["--set", "model.rope_theta=-1"], "model.rope_theta=-1.0 is invalid: > 0"),
    "a negative LoRA rank": (["--set", "model.lora.rank=-1"], "model.lora.rank=-1 is invalid: an integer >= 0"),
    "unknown LoRA targets": (["--set", "model.lora.rank=4", "--set", "model.lora.targets=foo"],
                             "model.lora.targets=('foo',) is invalid: a non-empty subset of ('q_proj', 'k_proj', "
                             "'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj') (foo unknown)"),
    "a LoRA dropout of 1.5": (["--set", "model.lora.dropout=1.5"], "model.lora.dropout=1.5 is invalid: in [0, 1)"),
    "a NaN LoRA alpha": (["--set", "model.lora.alpha=nan"], "model.lora.alpha='nan' is invalid: a finite number"),
    # task
    "a dataset that is a directory": (["--set", "task.name=jsonl_math",
                                       "--set", "task.options.path={files}/data.jsonl"],
                                      "data.jsonl': no such dataset file"),
    "an empty dataset": (["--set", "task.name=jsonl_math", "--set", "task.options.path={files}/empty.jsonl"],
                         "empty.jsonl' holds no records"),
    "a dataset that is not text": (["--set", "task.name=jsonl_math", "--set", "task.options.path={files}/binary.jsonl"],
                                   "binary.jsonl:1: not UTF-8 text: byte 0xff at column 1"),
    "a dataset that is one JSON array": (["--set", "task.name=jsonl_math",
                                          "--set", "task.options.path={files}/array.jsonl"],
                                         "array.jsonl:1: expected a JSON object, got list"),
    "a dataset whose prompts are numbers": (["--set", "task.name=jsonl_math", "--set",
                                             "task.options.path={files}/numbers.jsonl"],
                                            "numbers.jsonl:1: field 'question': the prompt must be a string or a "
                                            "list of chat messages, got int"),
    "a dataset without the prompt field": (["--set", "task.name=jsonl_math",
                                            "--set", "task.options.path={files}/good.jsonl",
                                            "--set", "task.options.prompt_field=q"],
                                           "good.jsonl:1: record lacks field(s) ['q']"),
    "a dataset task without a tokenizer": (["--set", "task.name=jsonl_math",
                                            "--set", "task.options.path={files}/good.jsonl"],
                                           "task.name='jsonl_math' has no tokenizer of its own: set model.path"),
    "zero digits": (["--set", "task.options.digits=0"],
                    "task.options={'digits': 0} for task 'arithmetic': ValueError: digits must be an int in [1, 18], "
                    "got 0"),
    "negative digits": (["--set", "task.options.digits=-1"],
                        "task.options={'digits': -1} for task 'arithmetic': ValueError: digits must be an int in "
                        "[1, 18], got -1"),
    "too many digits": (["--set", "task.options.digits=30"],
                        "task.options={'digits': 30} for task 'arithmetic': ValueError: digits must be an int in "
                        "[1, 18], got 30"),
    "an unknown operator": (["--set", "task.options.ops=^"],
                            "task.options={'ops': '^'} for task 'arithmetic': ValueError: ops must be distinct "
                            "characters from '+-*', got '^'"),
    "no operator": (["--set", "task.options.ops="],
                    "task.options={'ops': ''} for task 'arithmetic': ValueError: ops must be distinct characters "
                    "from '+-*', got ''"),
    "too few countdown numbers": (["--set", "task.name=countdown", "--set", "task.options.count=0"],
                                  "task.options={'count': 0} for task 'countdown': ValueError: count must be in "
                                  "[2, 8], got 0"),
    "a word share above 1": (["--set", "task.name=word_math", "--set", "task.options.word_share=2"],
                             "task.options={'word_share': 2} for task 'word_math': ValueError: word_share must be in "
                             "[0, 1], got 2"),
    "an unknown answer_from": (["--set", "task.name=word_math", "--set", "task.options.answer_from=foo"],
                               "task.options={'answer_from': 'foo'} for task 'word_math': ValueError: answer_from "
                               "must be one of"),
    "an unknown scratchpad placement": (["--set", "task.name=scratchpad_arithmetic",
                                         "--set", "task.options.working=middle"],
                                        "task.options={'working': 'middle'} for task 'scratchpad_arithmetic': "
                                        "ValueError: working must be 'before' or 'after' the answer, got 'middle'"),
    "a negative scratchpad": (["--set", "task.name=scratchpad_arithmetic", "--set", "task.options.max_scratch=-1"],
                              "task.options={'max_scratch': -1} for task 'scratchpad_arithmetic': ValueError: "
                              "max_scratch must be an int >= 0, got -1"),
    "an old task key": (["--set", "task.digits=3"],
                        "unknown config key 'task.digits'; did you mean task.options.digits?"),
    "an old reward key": (["--set", "task.reward_timeout=5"],
                          "unknown config key 'task.reward_timeout'; did you mean task.reward.timeout?"),
    "a NaN format weight": (["--set", "task.reward.format_weight=nan"], "task.reward.format_weight='nan' is "
                                                                        "invalid: a finite"),
    "an unknown chat template mode": (["--set", "task.prompt.chat_template=yes"],
                                      "task.prompt.chat_template='yes' is invalid"),
    "a system prompt without a chat template": (["--set", "task.prompt.system_prompt=hi"],
                                                "task: task.prompt.system_prompt is set but the prompts are "
                                                "plain text"),
    "a negative reward timeout": (["--set", "task.reward.timeout=-1"],
                                  "task.reward.timeout=-1.0 is invalid: finite seconds >= 0 (0: no limit)"),
    "an infinite reward timeout": (["--set", "task.reward.timeout=inf"], "task.reward.timeout='inf' is invalid"),
    # a user's task or reward function by import path
    "a task module with a syntax error": (["--set", "task.name=cli_mistake_syntax:make"],
                                          "task.name='cli_mistake_syntax:make' cannot be imported: "),
    "a reward module with a syntax error": (["--set", "task.reward.function=cli_mistake_syntax:reward"],
                                            "cli_mistake_syntax.py:1: SyntaxError: invalid syntax"),
    "a reward module that raises on import": (["--set", "task.reward.function=cli_mistake_import:reward"],
                                              "cli_mistake_import.py:2: ZeroDivisionError: division by zero"),
    "a reward module that does not exist": (["--set", "task.reward.function=cli_no_such_module:reward"],
                                            "cannot be imported: ModuleNotFoundError: No module named"),
    "a reward function that does not exist": (["--set", "task.reward.function=cli_mistake_tasks:nope"],
                                              "module 'cli_mistake_tasks' has no attribute 'nope'"),
    "a reward path without a name": (["--set", "task.reward.function=cli_mistake_tasks:"], "is not an import path"),
    "a reward that is a module": (["--set", "task.reward.function=pgjax:tasks"], "is not callable: it must be a "
                                                                                 "reward"),
    "a reward that is a class": (["--set", "task.reward.function=cli_mistake_tasks:NotATask"],
                                 "task.reward.function='cli_mistake_tasks:NotATask' is a class, not a reward function"),
    "a reward of one argument": (["--set", "task.reward.function=cli_mistake_tasks:one_argument"],
                                 "cannot be called as fn(prompts, completions, **fields): too many positional"),
    "a builtin as the reward": (["--set", "task.reward.function=builtins:len"], "cannot be called as "
                                                                                "fn(prompts, completions"),
    "a task factory that raises": (["--set", "task.name=cli_mistake_tasks:raises"],
                                   "cli_mistake_tasks.py:4: RuntimeError: boom"),
    "a task factory that divides by zero": (["--set", "task.name=cli_mistake_tasks:divides"],
                                            "cli_mistake_tasks.py:8: ZeroDivisionError: division by zero"),
    "a task factory that returns None": (["--set", "task.name=cli_mistake_tasks:returns_none"],
                                         "cli_mistake_tasks:returns_none returned None, not a task: it has no "
                                         "examples, reward_fn, tokenizer"),
    "a task factory that is not a task class": (["--set", "task.name=cli_mistake_tasks:NotATask"],
                                                "returned a NotATask (<cli_mistake_tasks.NotATask object"),
    "a builtin as the task factory": (["--set", "task.name=builtins:print"], "builtins:print returned None, not a"),
    "a task factory with a positional argument": (["--set", "task.name=cli_mistake_tasks:one_argument"],
                                                  "one_argument() missing 1 required positional argument: 'a'"),
    "a task factory with a keyword it is not given": (["--set", "task.name=cli_mistake_tasks:needs_secret"],
                                                      "missing 1 required keyword-only argument: 'secret'"),
    "a task without a verifier": (["--set", "task.name=cli_mistake_tasks:NoVerifier"], "it has no reward_fn"),
    "a task whose examples are strings": (["--set", "task.name=cli_mistake_tasks:StrExamples"],
                                          "examples(1, seed=0)[0] is a str ('ab'): an example is a dict with a str "
                                          "'prompt'"),
    "a task whose prompts are numbers": (["--set", "task.name=cli_mistake_tasks:IntPrompts"],
                                         "examples(1, seed=0)[0] is a dict ({'prompt': 12"),
    "a task whose examples are None": (["--set", "task.name=cli_mistake_tasks:NoExamples"],
                                       "examples(1, seed=0) returned None, not a list of examples"),
    "a task that returns too few examples": (["--set", "task.name=cli_mistake_tasks:TooFew"],
                                             "examples(256, seed=960352754) returned 2 examples"),
    "a task whose examples differ in fields": (["--set", "task.name=cli_mistake_tasks:MixedFields"],
                                               "example 1 lacks field(s) ['level']"),
    "a task whose tokenizer raises": (["--set", "task.name=cli_mistake_tasks:TokenizerRaises"],
                                      "cli_mistake_tasks.py:41: RuntimeError: no tokenizer today"),
    "a task whose tokenizer is a string": (["--set", "task.name=cli_mistake_tasks:TokenizerString"],
                                           "tokenizer() returned a str ('abx'), not a Hugging Face tokenizer"),
    "an unknown task without a path": (["--set", "task.name=cli_mistake_tasks"], "task.name='cli_mistake_tasks' is "
                                                                                 "unknown; valid: arithmetic"),
    # rollout, update, optimizers, algorithm
    "a top_p of 0": (["--set", "rollout.top_p=0"], "rollout.top_p=0.0 is invalid: in (0, 1] (1: off)"),
    "a negative top_k": (["--set", "rollout.top_k=-1"], "rollout.top_k=-1 is invalid: an integer >= 0 (0: off)"),
    "a zero temperature": (["--set", "rollout.temperature=0", "--set", "update.temperature=0"],
                           "rollout.temperature=0.0 is invalid: a finite number > 0 (greedy=True for argmax)"),
    "a zero prompt budget": (["--set", "rollout.max_prompt_tokens=0"],
                             "rollout.max_prompt_tokens=0 is invalid: an integer >= 1"),
    "negative staleness": (["--set", "rollout.staleness=-1"],
                           "rollout.staleness=-1 is invalid: an integer >= 0 (0: on-policy)"),
    "an overlong buffer as long as the budget": (["--set", "rollout.overlong_buffer=6"],
                                                 "rollout.overlong_buffer=6 "
                                                 "is invalid: an integer in [0, max_new_tokens=6) (0: off)"),
    "an unknown sampler dtype": (["--set", "rollout.compute_dtype=float16"],
                                 "rollout.compute_dtype='float16' is invalid: float32, bfloat16 or empty "
                                 "(the model's)"),
    "an unknown non-finite reward policy": (["--set", "rollout.nonfinite_rewards=skip"],
                                            "rollout.nonfinite_rewards='skip' is invalid: one of error, mask"),
    "negative sampler devices": (["--set", "rollout.sampler_devices=-1"],
                                 "rollout.sampler_devices=-1 is invalid: an integer >= 0 "
                                 "(0: the learner's devices)"),
    "zero epochs": (["--set", "update.epochs=0"], "update.epochs=0 is invalid: an integer >= 1"),
    "a zero chunk size": (["--set", "update.chunk_size=0"], "update.chunk_size=0 is invalid: an integer >= 1"),
    "a b1 of 1": (["--set", "optim.b1=1"], "optim.b1=1.0 is invalid: a finite number in [0, 1)"),
    "a negative critic learning rate": (["--set", "critic_optim.lr=-1"],
                                        "critic_optim.lr=-1.0 is invalid: a finite number > 0"),
    "a NaN gradient clip": (["--set", "optim.max_grad_norm=nan"], "optim.max_grad_norm='nan' is invalid"),
    "a zero warm-start learning rate": (["--set", "warm_start.optim.lr=0"],
                                        "warm_start.optim.lr=0.0 is invalid: a finite number > 0"),
    "a zero warm-start batch": (["--set", "warm_start.batch_size=0"], "warm_start.batch_size=0 is invalid"),
    "zero eval_every": (["--set", "eval_every=0"], "eval_every=0 is invalid: an integer >= 1"),
    "zero checkpoint_every": (["--set", "checkpoint_every=0"], "checkpoint_every=0 is invalid: an integer >= 1"),
    "an unknown correction": (["--set", "algorithm.correction=foo"], "algorithm.correction='foo' is invalid: one of"),
    "a behaviour ratio on an on-policy preset": (["--set", "algorithm.preset=reinforce", "--set",
                                                  "algorithm.correction=behaviour_ratio"],
                                                 "algorithm.correction='behaviour_ratio': reinforce: correction"),
    "an unknown hyperparameter": (["--set", "algorithm.hparams.foo=1"], "unknown config key 'algorithm.hparams.foo'"),
    "a NaN hyperparameter": (["--set", "algorithm.hparams.gamma=nan"], "algorithm.hparams.gamma='nan' is invalid"),
    "a gamma above 1": (["--set", "algorithm.hparams.gamma=2"], "hyperparameter gamma=2.0 must be in [0, 1]"),
    # logging, mesh, distributed
    "a negative progress interval": (["--set", "logging.progress_every=-1"],
                                     "logging.progress_every=-1.0 is invalid: >= 0 seconds"),
    "a NaN progress interval": (["--set", "logging.progress_every=nan"], "logging.progress_every='nan' is invalid"),
    "an infinite progress interval": (["--set", "logging.progress_every=inf"], "logging.progress_every='inf' is"),
    "a mesh axis of -2": (["--set", "mesh.data=-2"],
                          "mesh.data=-2 is invalid: an integer >= 1, or -1 (the rest of the devices)"),
    "two mesh axes of -1": (["--set", "mesh.fsdp=-1"],
                            "mesh.fsdp=-1 "
                            "is invalid: an integer >= 1 here: mesh.data=-1 takes the rest of the devices already"),
    "a mesh axis of 0": (["--set", "mesh.tensor=0"],
                         "mesh.tensor=0 is invalid: an integer >= 1, or -1 (the rest of the devices)"),
    "an unknown distributed mode": (["--set", "distributed.initialize=maybe"],
                                    "distributed.initialize='maybe' is invalid: one of auto, on, off"),
}

MISTAKE_MODULES = {
    "cli_mistake_syntax.py": "def reward(:\n    pass\n",
    "cli_mistake_import.py": "import math\nratio = 1 / 0\n",
    "cli_mistake_tasks.py": '''import dataclasses
from helpers import EmitX
def raises(**options):
    raise RuntimeError("boom")
def returns_none(**options):
    return None
def divides(**options):
    return 1 / 0
class NotATask:
    pass
def one_argument(a):
    return a
def needs_secret(*, secret):
    return EmitX()
@dataclasses.dataclass(frozen=True)
class NoVerifier(EmitX):
    reward_fn = None
@dataclasses.dataclass(frozen=True)
class StrExamples(EmitX):
    def examples(self, n, seed=0):
        return ["ab"] * n
@dataclasses.dataclass(frozen=True)
class IntPrompts(EmitX):
    def examples(self, n, seed=0):
        return [{"prompt": 12, "answer": "x"}] * n
@dataclasses.dataclass(frozen=True)
class NoExamples(EmitX):
    def examples(self, n, seed=0):
        return None
@dataclasses.dataclass(frozen=True)
class TooFew(EmitX):
    def examples(self, n, seed=0):
        return [{"prompt": "ab", "answer": "x"}] * min(n, 2)
@dataclasses.dataclass(frozen=True)
class MixedFields(EmitX):
    def examples(self, n, seed=0):
        return [{"prompt": "ab", "answer": "x", "level": 1}] + [{"prompt": "ab", "answer": "x"}] * (n - 1)
@dataclasses.dataclass(frozen=True)
class TokenizerRaises(EmitX):
    def tokenizer(self):
        raise RuntimeError("no tokenizer today")
@dataclasses.dataclass(frozen=True)
class TokenizerString(EmitX):
    def tokenizer(self):
        return "abx"
''',
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A directory on sys.path with the files the mistakes name: user modules (``MISTAKE_MODULES``),
    broken checkpoints and datasets."""
    directory = tmp_path_factory.mktemp("mistakes")
    for name, source in MISTAKE_MODULES.items():
        (directory / name).write_text(source)
    (directory / "a_file").write_text("not a checkpoint")
    for name, text in {"broken_json": "{not json", "list_json": "[]", "no_model_type": "{}",
                       "gpt2": json.dumps({"model_type": "gpt2", "vocab_size": 60000})}.items():
        (directory / name).mkdir()
        (directory / name / "config.json").write_text(text)
    (directory / "binary_json").mkdir()
    (directory / "binary_json" / "config.json").write_bytes(b"\xff\xfe\x00")
    (directory / "json_directory" / "config.json").mkdir(parents=True)
    tiny_hf_config("qwen3", True).save_pretrained(directory / "no_weights")
    (directory / "data.jsonl").mkdir()
    (directory / "empty.jsonl").write_text("")
    (directory / "binary.jsonl").write_bytes(b"\xff\xfe\x00\x01")
    (directory / "array.jsonl").write_text(json.dumps([{"question": "1+1?", "answer": "2"}]))
    (directory / "numbers.jsonl").write_text(json.dumps({"question": 5, "answer": "2"}) + "\n")
    (directory / "good.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(directory))
        yield directory


@pytest.mark.parametrize("case", CASES)
def test_each_configuration_mistake_exits_2_with_a_plain_message_and_writes_nothing(case, capsys, tmp_path,
                                                                                   monkeypatch, files):
    argv, message = CASES[case]
    assert message in fails(capsys, tmp_path, monkeypatch, *[a.replace("{files}", str(files)) for a in argv])


IMPORTS = ("from pgjax.config import (AlgorithmSection, Experiment, LoggingSection, LoRASection, MeshConfig, "
           "ModelSection, OptimConfig, RewardSection, RolloutConfig, TaskSection, UpdateConfig, WarmStartSection)\n")


def returns(expression: str) -> str:
    """An experiment file whose ``experiment()`` returns ``expression``."""
    return f"{IMPORTS}def experiment():\n    return {expression}\n"


FILE_CASES = {
    "a syntax error": ("x = 1\ndef experiment(:\n    pass\n", "experiment.py:2: SyntaxError: invalid syntax"),
    "an indentation error": ("def experiment():\nreturn 1\n",
                             "experiment.py:2: IndentationError: expected an indented block after function definition "
                             "on line 1"),
    "an undefined name at import": ("x = undefined_name\n",
                                    "experiment.py:1: NameError: name 'undefined_name' is not defined"),
    "a misspelt import": ("from pgjax.config import Experimnt\n",
                          "experiment.py:1: ImportError: cannot import name 'Experimnt' from 'pgjax.config'"),
    "the module the configuration was in": ("from pgjax.train.experiment import Experiment\n",
                                            "experiment.py:1: ModuleNotFoundError: No module named "
                                            "'pgjax.train.experiment' (pgjax.train.experiment is now pgjax.config: "
                                            "from pgjax.config import Experiment, ...)"),
    "a missing module": ("import no_such_module_xyz\n",
                         "experiment.py:1: ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    "experiment() raises": ("def experiment():\n    return 1 / 0\n",
                            "experiment.py:2: experiment() raised ZeroDivisionError: division by zero"),
    "experiment() raises a RuntimeError": ("def experiment():\n    raise RuntimeError('not today')\n",
                                           "experiment.py:2: experiment() raised RuntimeError: not today"),
    "experiment() raises a KeyError": ("def experiment():\n    return {}['steps']\n",
                                       "experiment.py:2: experiment() raised KeyError: 'steps'"),
    "no experiment()": ("x = 1\n", "must define experiment() returning a pgjax Experiment"),
    "experiment is not a function": (f"{IMPORTS}experiment = Experiment()\n", "'Experiment' object is not callable"),
    "experiment() takes an argument": ("def experiment(seed):\n    pass\n",
                                       "experiment() missing 1 required positional argument: 'seed'"),
    "experiment() returns None": ("def experiment():\n    pass\n",
                                  "experiment() returned NoneType, not an Experiment"),
    "an unknown field": (returns("Experiment(stepz=3)"), "unexpected keyword argument 'stepz'; did you mean steps?"),
    "a renamed field": (returns("Experiment(model=ModelSection(layers=3))"),
                        "unexpected keyword argument 'layers' (layers is now model.num_hidden_layers)"),
    "a positional section field": (returns("Experiment(rollout=RolloutConfig(8))"),
                                   "takes 1 positional argument but 2 were given"),
    "steps as a string": (returns('Experiment(steps="10")'), "steps='10' is invalid: an int is expected"),
    "steps as a float": (returns("Experiment(steps=1.5)"), "steps=1.5 is invalid: an int is expected"),
    "steps as a bool": (returns("Experiment(steps=True)"), "steps=True is invalid: an int is expected"),
    "a float seed": (returns("Experiment(seed=1.5)"), "seed=1.5 is invalid: an int is expected"),
    "a string seed": (returns('Experiment(seed="0")'), "seed='0' is invalid: an int is expected"),
    "a seed of 2**64": (returns("Experiment(seed=2**64)"), "seed=18446744073709551616 is invalid: an integer in"),
    "a whole float batch": (returns("Experiment(prompts_per_step=32.0)"),
                            "prompts_per_step=32.0 is invalid: an int is expected"),
    "a NumPy integer": ("import numpy as np\n" + returns("Experiment(eval_every=np.int64(5))"),
                        "eval_every=np.int64(5) is invalid: an int is expected"),
    "a name that is a number": (returns("Experiment(name=5)"), "name=5 is invalid: a str is expected"),
    "a name that is None": (returns("Experiment(name=None)"), "name=None is invalid: a str is expected"),
    "a name with a NUL": (returns('Experiment(name="a\\0b")'), "name='a\\x00b' is invalid: a non-empty name"),
    "a task given by name": (returns('Experiment(task="arithmetic")'),
                             "task='arithmetic' is invalid: TaskSection(...) is expected"),
    "a model given as a dict": (returns('Experiment(model={"hidden_size": 64})'),
                                "model={'hidden_size': 64} is invalid: ModelSection(...) is expected"),
    "an algorithm given as a number": (returns("Experiment(algorithm=3)"),
                                       "algorithm=3 is invalid: AlgorithmSection(...) is expected"),
    "an unknown algorithm": (returns('Experiment(algorithm="trpo")'), "algorithm.preset='trpo' is invalid: one of"),
    "a float sample count": (returns("Experiment(rollout=RolloutConfig(samples_per_prompt=8.0))"),
                             "rollout.samples_per_prompt=8.0 is invalid: an int is expected"),
    "a float epoch count": (returns("Experiment(update=UpdateConfig(epochs=1.0))"),
                            "update.epochs=1.0 is invalid: an int is expected"),
    "a float mesh size": (returns("Experiment(mesh=MeshConfig(data=1.0))"),
                          "mesh.data=1.0 is invalid: an int is expected"),
    "a task option as a field": (returns('Experiment(task=TaskSection(digits=2))'),
                                 "experiment.py:3: TaskSection.__init__() got an unexpected keyword argument 'digits' "
                                 "(digits is now task.options.digits)"),
    "digits as a string": (returns('Experiment(task=TaskSection(options={"digits": "2"}))'),
                           "task.options.digits='2' is invalid: an int is expected"),
    "digits as a float": (returns('Experiment(task=TaskSection(options={"digits": 2.0}))'),
                          "task.options.digits=2.0 is invalid: an int is expected"),
    "operators as a list": (returns('Experiment(task=TaskSection(options={"ops": ["+"]}))'),
                            "task.options.ops=['+'] is invalid: a str is expected"),
    "a reward function object instead of its path": (returns("Experiment(task=TaskSection(reward=len))"),
                                                     "task.reward.function=<built-in function len> is invalid: a str"),
    "a format weight as a string": (returns('Experiment(task=TaskSection(reward=RewardSection(format_weight="0.1")))'),
                                    "task.reward.format_weight='0.1' is invalid: a number is expected"),
    "a bool as a string": (returns('Experiment(logging=LoggingSection(tensorboard="false"))'),
                           "logging.tensorboard='false' is invalid: a bool, true or false"),
    "a bool as 0": (returns("Experiment(logging=LoggingSection(tensorboard=0))"),
                    "logging.tensorboard=0 is invalid: a bool, true or false"),
    "a progress interval as a string": (returns('Experiment(logging=LoggingSection(progress_every="30"))'),
                                        "logging.progress_every='30' is invalid: a number is expected"),
    "hyperparameters as a list": (returns("Experiment(algorithm=AlgorithmSection(hparams=[1]))"),
                                  "algorithm.hparams=[1] is invalid: a dict is expected"),
    "a hyperparameter as a string": (returns('Experiment(algorithm=AlgorithmSection(preset="grpo", '
                                             'hparams={"kl_coef": "0.1"}))'),
                                     "algorithm.hparams.kl_coef='0.1' is invalid: a number is expected"),
    "an unknown hyperparameter": (returns('Experiment(algorithm=AlgorithmSection(preset="grpo", hparams={"kl": 0.1}))'),
                                  "algorithm.hparams: unknown hyperparameter(s) ['kl']"),
    "a float LoRA rank": (returns("Experiment(model=ModelSection(lora=LoRASection(rank=4.0)))"),
                          "model.lora.rank=4.0 is invalid: an int is expected"),
    "a number as model.path": (returns("Experiment(model=ModelSection(path=0))"),
                               "model.path=0 is invalid: a str is expected"),
    "a pathlib.Path as model.path": ("import pathlib\n" + returns('Experiment(model=ModelSection(path=pathlib.Path('
                                                                   '"/nope")))'),
                                     "model.path=PosixPath('/nope') is invalid: a str is expected"),
    "a pathlib.Path as run_dir": ("import pathlib\n" + returns('Experiment(run_dir=pathlib.Path("/tmp/x"))'),
                                  "run_dir=PosixPath('/tmp/x') is invalid: a str is expected"),
    "a float warm start": (returns("Experiment(warm_start=WarmStartSection(steps=1.5))"),
                           "warm_start.steps=1.5 is invalid: an int is expected"),
    # a number as a string in a section whose own checks compare it first: the key named all the same
    "a sample count as a string": (returns('Experiment(rollout=RolloutConfig(samples_per_prompt="8"))'),
                                   "rollout.samples_per_prompt='8' is invalid: an int is expected"),
    "a learning rate as a string": (returns('Experiment(optim=OptimConfig(lr="1e-3"))'),
                                    "OptimConfig.lr='1e-3' is invalid: a number is expected"),
}


@pytest.mark.parametrize("case", FILE_CASES)
def test_each_mistake_in_an_experiment_file_exits_2_with_a_plain_message_and_writes_nothing(case, capsys, tmp_path,
                                                                                          monkeypatch):
    source, message = FILE_CASES[case]
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "experiment.py").write_text(source)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)       # no __pycache__ from loading the file
    assert message in fails(capsys, tmp_path, monkeypatch, experiment=str(tmp_path / "exp" / "experiment.py"))


def test_a_group_baseline_with_one_sample_per_prompt_is_refused(capsys, tmp_path, monkeypatch):
    err = fails(capsys, tmp_path, monkeypatch, "--set", "rollout.samples_per_prompt=1", experiment=GRPO)
    assert "rollout.samples_per_prompt=1 is invalid for grpo: its group baseline compares K >= 2" in err


def test_a_run_directory_that_cannot_be_written_is_refused(capsys, tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("not a directory")
    err = fails(capsys, tmp_path, monkeypatch, "--set", f"run_dir={tmp_path / 'a_file' / 'run'}")
    assert "cannot be written" in err and "a_file is not a writable directory" in err


def test_a_missing_experiment_file_is_refused(capsys, tmp_path, monkeypatch):
    err = fails(capsys, tmp_path, monkeypatch, experiment=str(tmp_path / "nope.py"))
    assert "no experiment file" in err and "nope.py" in err


def test_the_real_command_prints_no_traceback(tmp_path):
    """The same through ``python -m pgjax.run`` in a subprocess (what a user sees)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pgjax.run", MAIN_JOB, "--set", "model.layers=3"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "pgjax.run: error: unknown config key 'model.layers'; did you mean model.num_hidden_layers?",
        "(--print-config lists every key and its value)"]
    assert done.stdout == "" and not (tmp_path / "runs").exists()


def test_a_syntax_error_in_the_experiment_file_is_one_line_from_the_real_command(tmp_path):
    (tmp_path / "broken.py").write_text("from pgjax.config import Experiment\n\ndef experiment(:\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pgjax.run", "broken.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["pgjax.run: error: broken.py:3: SyntaxError: invalid syntax"]
    assert done.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["broken.py"]


def test_print_config_lists_every_key_with_its_resolved_value(capsys):
    assert run.main([GRPO, "--set", "rollout.temperature=0.8", "--print-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    values = dict(line.split(" = ", 1) for line in lines)
    keys = [*config_lib.valid_keys(), "task.options.digits", "task.options.ops"]    # and the task's own options
    assert sorted(values) == sorted(keys)
    assert values["rollout.temperature"] == "0.8" and values["algorithm.preset"] == "'grpo'"
    assert values["task.options.digits"] == "2" and values["task.options.ops"] == "'+'"    # its factory's defaults
    # the preset's
    assert values["algorithm.hparams.kl_coef"] == "0.04" and values["algorithm.hparams.divide_by_std"] == "1.0"


def test_help_lists_the_sections(capsys):
    with pytest.raises(SystemExit) as exit_status:
        run.main(["--help"])
    assert exit_status.value.code == 0
    out = capsys.readouterr().out
    for section in ("algorithm", "model", "task", "rollout", "update", "optim", "warm_start", "logging", "mesh",
                    "distributed"):
        assert f"\n  {section} " in out, section
    assert "algorithm.hparams.kl_coef=0.01" in out
    assert "--print-config" in out and "--resume" in out
