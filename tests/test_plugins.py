"""Research code plugged in from outside pgjax by import path (``pgjax.plugins``, docs/extending.md): a
third-party module written to a temporary directory per kind (a task with its own options, a tool, a
logging sink, a model family) and named by ``package.module:name`` where it is used, working end to end;
a bad import path of each kind a ConfigError naming its key; every plugged-in module fingerprinted,
so that ``--resume`` notices one edited in place."""
import dataclasses
import json
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import EMIT_X, TINY_MODEL, save_tiny_checkpoint, save_tiny_tokenizer, tiny_experiment

from pgjax import plugins
from pgjax.config import ConfigError, Experiment, LoggingSection, ModelSection, TaskSection, override, valid_keys
from pgjax.models import hf
from pgjax.models.transformer import FAMILIES, CausalLM, Family, family_of
from pgjax.train import inputs
from pgjax.train.run_dir import RunDirectory
from pgjax.train.sinks import read_records
from pgjax.train.trainer import train


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``write(name, source)``: the module ``name`` of a third-party package, written to a folder put on
    ``sys.path``, importable as ``name`` (dropped from ``sys.modules`` after the test)."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    written = []

    def write(name: str, source: str):
        path = folder / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        sys.modules.pop(name, None)
        written.append(name)
        return path

    yield write
    for name in written:
        sys.modules.pop(name, None)


# ---------------------------------------------------------------- the mechanism

def test_resolve_takes_a_builtin_name_or_an_import_path_and_names_the_key(plugin):
    plugin("plug_objects", "VALUE = 42\n")
    builtins = {"one": 1, "two": 2}
    assert plugins.resolve("thing.kind", "two", builtins, "thing") == 2
    assert plugins.resolve("thing.kind", "plug_objects:VALUE", builtins, "thing") == 42
    with pytest.raises(ValueError, match="thing.kind='three' is unknown; valid: one, two, or the import path "
                                         "package.module:name of your own thing"):
        plugins.resolve("thing.kind", "three", builtins, "thing")
    with pytest.raises(ValueError, match="thing.kind='plug_objects:NOPE' cannot be imported: .*NOPE"):
        plugins.resolve("thing.kind", "plug_objects:NOPE", builtins, "thing")
    with pytest.raises(ValueError, match="thing.kind='no_such_plug_module:X' cannot be imported: "
                                         "ModuleNotFoundError"):
        plugins.resolve("thing.kind", "no_such_plug_module:X", builtins, "thing")
    broken = plugin("plug_broken", "import math\nVALUE = 1 / 0\n")
    with pytest.raises(ValueError, match=f"cannot be imported: {broken}:2: ZeroDivisionError"):
        plugins.resolve("thing.kind", "plug_broken:VALUE", builtins, "thing")
    with pytest.raises(ValueError, match="thing.kind='bare' is not an import path"):
        plugins.resolve("thing.kind", "bare", {}, "thing")          # no built-ins: import paths only


@pytest.mark.parametrize("assignment, message", [
    ("task.name=no_such_plug_module:make", "task.name='no_such_plug_module:make' cannot be imported"),
    ("task.reward.function=no_such_plug_module:reward", "task.reward.function='no_such_plug_module:reward' "
                                                        "cannot be imported"),
    ("task.tools.names=calculator,no_such_plug_module:Tool", "task.tools.names='no_such_plug_module:Tool' "
                                                             "cannot be imported"),
    ("model.family=no_such_plug_module:FAMILY", "model.family='no_such_plug_module:FAMILY' cannot be imported"),
    ("task.tools.names=shell", "task.tools.names='shell' is invalid: comma-separated tools, each one of "
                               "calculator, python or "
                         "the import path"),
    ("model.family=mistral", "model.family='mistral' is invalid: one of ('llama', 'qwen2', 'qwen3', 'gemma3'), or "
                             "the import path package.module:NAME of a Family of your own"),
    ("logging.sinks=csv", "logging.sinks='csv' is invalid: comma-separated import paths"),
])
def test_every_kind_names_its_key_for_a_bad_import_path(assignment, message, tmp_path):
    """Each kind's bad name or import path is a ConfigError naming the key, before anything is
    written: a section's own check, or ``validate`` / the run directory for the ones that import."""
    from pgjax.train.trainer import Trainer
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        exp = override(tiny_experiment(tmp_path), [assignment])
        RunDirectory(exp, resume=False)
        Trainer(exp)
    assert not (tmp_path / "run").exists()


def test_a_sink_path_that_is_not_a_sink_is_refused_before_anything_is_written(plugin, tmp_path):
    plugin("plug_not_sinks", "class Plain:\n    pass\n\nNUMBER = 3\n")
    for path, message in (("no_such_plug_module:Sink", "cannot be imported: ModuleNotFoundError"),
                          ("plug_not_sinks:Plain", "is the class Plain, not a subclass of pgjax.train.sinks.Sink"),
                          ("plug_not_sinks:NUMBER", "is an int \\(3\\): a Sink subclass or a factory")):
        exp = tiny_experiment(tmp_path, logging=LoggingSection(sinks=path))
        with pytest.raises(ConfigError, match=f"logging.sinks='{path}' {message}"):
            RunDirectory(exp, resume=False)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- tasks with their own options

TASK_MODULE = """
import dataclasses

from pgjax.tasks import char_tokenizer, per_example

SEEN = []       # the options each call of make received


@per_example
def starts_with(prompt, completion, *, letter, **_):
    return float(completion.startswith(letter))


@dataclasses.dataclass(frozen=True)
class LetterTask:
    letter: str
    name: str = "letter"
    format_pattern: str = "[abx]*"
    reward_fn = staticmethod(starts_with)

    def tokenizer(self):
        return char_tokenizer("abx")

    def examples(self, n, seed=0):
        return [{"prompt": "ab", "answer": self.letter, "letter": self.letter} for _ in range(n)]


def make(letter="x", repeats=1, digits=2):
    if letter not in ("a", "b", "x"):
        raise ValueError(f"letter must be a, b or x, got {letter!r}")
    SEEN.append({"letter": letter, "repeats": repeats, "digits": digits})
    return LetterTask(letter)
"""


def test_a_task_with_its_own_options_trains_and_gets_them(plugin, tmp_path):
    """task.options reach the factory as keyword arguments (``digits`` as well, an option the built-in
    tasks have too), through validate and the task context, and the run trains on the task."""
    plugin("plug_task", TASK_MODULE)
    exp = tiny_experiment(
        tmp_path,
        steps=2,
        checkpoint_every=2,
        eval_every=2,
        logging=LoggingSection(tensorboard=False),
        task=TaskSection(name="plug_task:make", options={"letter": "b", "repeats": 2, "digits": 3}),
    )
    directory = train(exp, progress=False)
    seen = sys.modules["plug_task"].SEEN
    assert seen and all(call == {"letter": "b", "repeats": 2, "digits": 3} for call in seen)
    records = read_records(directory)
    assert [r["step"] for r in records] == [0, 1, 2] and all(np.isfinite(r["policy_loss"]) for r in records[1:])
    saved = json.loads((directory / "experiment.json").read_text())
    assert saved["task"]["options"] == {"letter": "b", "repeats": 2, "digits": 3}


def test_task_options_are_checked_by_the_factory_before_anything_is_written(plugin, tmp_path):
    path = plugin("plug_task_checks", TASK_MODULE)
    cases = [(TaskSection(name="plug_task_checks:make", options={"letter": "z"}),
              rf"task.options={{'letter': 'z'}} for task 'plug_task_checks:make': {path}:\d+: ValueError: letter "
              "must be a, b or x, got 'z'"),
             (TaskSection(name="plug_task_checks:make", options={"colour": "red"}),
              "task.options.colour='red' does nothing for task 'plug_task_checks:make', which takes letter, "
              "repeats, digits"),
             (TaskSection(name="arithmetic", options={"colour": "red"}),     # a built-in task takes its own only
              "task.options.colour='red' does nothing for task 'arithmetic', which takes digits, ops"),
             (TaskSection(name="arithmetic", options={"digits": "3"}),       # of the type its signature declares
              "task.options.digits='3' is invalid: an int is expected")]
    for task, message in cases:
        with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
            train(tiny_experiment(tmp_path, task=task), progress=False)
    assert not (tmp_path / "run").exists()


def test_set_task_options_reads_json_and_keeps_text(plugin):
    plugin("plug_task_set", TASK_MODULE)
    exp = override(Experiment(), ["task.name=plug_task_set:make", "task.options.x=3", "task.options.letter=b",
                                  "task.options.share=0.5", "task.options.on=true", "task.options.ids=[1, 2]"])
    assert exp.task.options == {"x": 3, "letter": "b", "share": 0.5, "on": True, "ids": [1, 2]}
    assert override(exp, ["task.options={\"letter\": \"a\"}", "task.options.y=\"7\""]).task.options == {
        "letter": "a", "y": "7"}                            # a whole dict, then one key (a JSON string)
    assert "task.options" in valid_keys()
    with pytest.raises(ConfigError, match="unknown config key 'task.option.x'; did you mean task.options.x\\?"):
        override(exp, ["task.option.x=3"])
    with pytest.raises(ConfigError, match="task.options.a.b='1' is invalid"):
        override(exp, ["task.options.a.b=1"])
    with pytest.raises(ConfigError, match="task.options='3' is invalid: a JSON object is expected"):
        override(exp, ["task.options=3"])


# ---------------------------------------------------------------- tools

TOOL_MODULE = """
from pgjax.agents import ToolResult

CALLS = []


class Reverse:
    name = "reverse"
    description = "writes its text backwards"
    parameter = "text"

    def __call__(self, arguments):
        CALLS.append(arguments)
        return ToolResult(arguments[::-1], ok=True)


def broken():
    raise RuntimeError("no licence for this tool")


class NotATool:
    name = "nothing"
"""


def test_a_tool_of_your_own_is_called_in_a_multi_turn_episode(plugin, tmp_path):
    """task.tools.names with a built-in and a tool by import path: the environment's tool prompt offers both,
    a reply calling the user's tool gets its result as the observation, and the task's verifier scores
    the final reply; a tool that cannot be built, or is not a tool, is a ConfigError naming it."""
    from pgjax.train.context import task_context
    path = plugin("plug_tools", TOOL_MODULE)
    exp = tiny_experiment(tmp_path, task=TaskSection(name="helpers:SumWithCalculator",
                                                     tools="calculator,plug_tools:Reverse"))
    exp = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, max_prompt_tokens=400, max_turns=3))
    context = task_context(exp, fit_to=400)
    environment = context.environment()
    example = context.task.examples(1, seed=0)[0]
    opening = environment.reset(example)
    assert "<reverse>" in opening[0]["content"] and "<calculator>" in opening[0]["content"]
    step = environment.step("<reverse>abc</reverse>")
    assert step.observation[0]["content"] == "<result>cba</result>" and not step.done
    assert sys.modules["plug_tools"].CALLS == ["abc"]
    final = environment.step(example["answer"])
    assert final.done and final.reward == 1.0
    for tools, message in (("plug_tools:broken", rf"task.tools.names=plug_tools:broken: {path}:\d+: RuntimeError: no "
                                                 "licence for this tool"),
                           ("plug_tools:NotATool", "task.tools.names=plug_tools:NotATool: it gave a NotATool .*, not a "
                                                   "tool: it lacks a str description, a str parameter, __call__"),
                           ("plug_tools:Reverse,plug_tools:Reverse", "two tools have the same name")):
        with pytest.raises(ConfigError, match=message):
            task_context(dataclasses.replace(exp, task=dataclasses.replace(exp.task, tools=tools)))


@pytest.mark.slow
def test_a_run_with_a_tool_of_your_own_trains(plugin, tmp_path):
    """The Trainer takes the user's tool like a built-in: a run of multi-turn episodes trains."""
    plugin("plug_tools_run", TOOL_MODULE)
    exp = tiny_experiment(tmp_path, steps=1, checkpoint_every=1, eval_every=1, eval_prompts=4,
                          logging=LoggingSection(tensorboard=False),
                          task=TaskSection(name="helpers:SumWithCalculator", tools="plug_tools_run:Reverse"))
    exp = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, max_prompt_tokens=280, max_new_tokens=4,
                                                               max_turns=2))
    records = read_records(train(exp, progress=False))
    assert [r["step"] for r in records] == [0, 1] and np.isfinite(records[-1]["policy_loss"])


# ---------------------------------------------------------------- logging sinks

SINK_MODULE = """
import json
import math

from pgjax.train.sinks import Sink

OPENED = []     # (directory, since) of each opening


class JsonLines(Sink):
    \"\"\"Every record to mine.jsonl; a resume keeps what was logged up to ``since``.\"\"\"

    def __init__(self, directory, since):
        OPENED.append((str(directory), since))
        self.path = directory / "mine.jsonl"
        lines = self.path.read_text().splitlines() if self.path.exists() and since is not None else []
        kept = [line for line in lines if json.loads(line)["step"] <= since]
        self.path.write_text("".join(line + "\\n" for line in kept))

    def log(self, record, completions=()):
        record = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\\n")

    def close(self, failed=False):
        (self.path.parent / "mine.closed").write_text(str(failed))


class Broken(Sink):
    \"\"\"Changes the record it gets, then fails.\"\"\"

    def __init__(self, directory, since):
        pass

    def log(self, record, completions=()):
        record["step"] = -1
        record.clear()
        raise OSError("disk full")
"""


def test_a_sink_of_your_own_gets_every_record_and_resumes_after_the_checkpoint(plugin, tmp_path, capsys):
    """logging.sinks: the user's sink is opened with the run directory and None, gets every record that
    metrics.jsonl gets, and is closed; a failing sink is reported once and left out, the run and the other
    records intact. A resume opens it with the checkpoint's step, and it ends with the same records again."""
    plugin("plug_sinks", SINK_MODULE)
    sinks = "plug_sinks:Broken,plug_sinks:JsonLines"
    exp = tiny_experiment(tmp_path, steps=2, checkpoint_every=2, eval_every=2, task=EMIT_X,
                          logging=LoggingSection(tensorboard=False, sinks=sinks))
    directory = train(exp, progress=False)
    mine = lambda: [json.loads(line) for line in (directory / "mine.jsonl").read_text().splitlines()]  # noqa: E731
    assert mine() == read_records(directory) and [r["step"] for r in mine()] == [0, 1, 2]
    assert (directory / "mine.closed").read_text() == "False"
    err = capsys.readouterr().err
    assert err.count("logging.sinks=plug_sinks:Broken: log raised OSError: disk full") == 1
    assert "this sink is left out for the rest of the run" in err
    train(dataclasses.replace(exp, steps=4), resume=True, progress=False)
    assert sys.modules["plug_sinks"].OPENED == [(str(directory), None), (str(directory), 2)]
    assert mine() == read_records(directory) and [r["step"] for r in mine()] == [0, 1, 2, 3, 4]


def test_a_sink_that_fails_to_open_is_a_config_error_naming_it(plugin, tmp_path):
    path = plugin("plug_sinks_open", """
        from pgjax.train.sinks import Sink

        class Picky(Sink):
            def __init__(self, directory, since):
                raise PermissionError("no such bucket")

        def nothing(directory, since):
            return 3
        """)
    exp = tiny_experiment(tmp_path, task=EMIT_X, logging=LoggingSection(sinks="plug_sinks_open:Picky"))
    with pytest.raises(ConfigError, match=rf"logging.sinks='plug_sinks_open:Picky': opening it as factory\(directory, "
                                          rf"since\) raised {path}:\d+: PermissionError: no such bucket"):
        train(exp, progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    run = RunDirectory(tiny_experiment(tmp_path / "other", logging=LoggingSection(sinks="plug_sinks_open:nothing")),
                       resume=False)
    with pytest.raises(ConfigError, match=r"logging.sinks='plug_sinks_open:nothing' gave an int \(3\), which has no "
                                          "log"):
        run.create()
        try:
            run.start(None, 0)
        finally:
            run.close(failed=True)


# ---------------------------------------------------------------- model families

FAMILY_MODULE = """
from pgjax.models.transformer import Family

# transformers' Mistral is Llama's architecture; its config's sliding window, on by default, is not
MISTRAL = Family(name="mistral", model_type="mistral", architecture="MistralForCausalLM",
                 extra_config={"sliding_window": None})
NOT_A_FAMILY = "mistral"
"""


def mistral_checkpoint(directory, sliding_window=None):
    """A tiny random transformers Mistral (norms moved away from 1) saved to ``directory``; the float model."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch", reason="the reference logits need torch")
    torch.manual_seed(0)
    config = transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                        max_position_embeddings=64, rms_norm_eps=1e-6, sliding_window=sliding_window,
                                        tie_word_embeddings=False)
    ref = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ref.save_pretrained(directory)
    save_tiny_tokenizer(directory)
    return ref


def logits_of(ref, tokens, mask):
    import torch
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    with torch.no_grad():
        return ref(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                   position_ids=torch.tensor(positions)).logits.numpy()


def test_a_family_of_your_own_loads_runs_and_saves_a_transformers_checkpoint(plugin, tmp_path):
    """model.family="plug_family:MISTRAL": a transformers Mistral checkpoint loads through the family
    named by import path (threaded from the model section), gives transformers' logits, and saves back a
    checkpoint transformers loads with the same logits; without the family, or with a family of another
    model_type, the checkpoint is a clear error."""
    transformers = pytest.importorskip("transformers")
    plugin("plug_family", FAMILY_MODULE)
    ref = mistral_checkpoint(tmp_path / "mistral")
    section = ModelSection(path=str(tmp_path / "mistral"), family="plug_family:MISTRAL", scan_layers=False)
    assert section.runtime_options()["family"] == "plug_family:MISTRAL"
    model = hf.load(section.path, **section.runtime_options())
    assert model.config.family == "plug_family:MISTRAL" and model.config.family_spec.name == "mistral"
    tokens = np.random.default_rng(0).integers(1, 64, size=(3, 9))
    mask = np.ones((3, 9), np.int64)
    mask[1, :3] = 0
    want = logits_of(ref, tokens, mask)
    got = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))
    assert np.abs(got - want)[mask > 0].max() <= 1e-4
    hf.save(model, tmp_path / "saved", tokenizer_dir=tmp_path / "mistral")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"], saved["sliding_window"]) == (
        "mistral", ["MistralForCausalLM"], None)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    assert type(back).__name__ == "MistralForCausalLM"
    np.testing.assert_allclose(logits_of(back, tokens, mask)[mask > 0], want[mask > 0], atol=1e-5)
    stacked = hf.load(tmp_path / "saved", family="plug_family:MISTRAL", scan_layers=True)
    np.testing.assert_allclose(np.asarray(stacked(jnp.asarray(tokens), jnp.asarray(mask)))[mask > 0],
                               got[mask > 0], atol=1e-5)
    with pytest.raises(ValueError, match="unsupported architecture 'mistral'; .* or name a family of your own with "
                                         "that model_type by its import path: model.family=package.module:NAME"):
        hf.load(tmp_path / "mistral")
    qwen = save_tiny_checkpoint(tmp_path / "qwen")
    with pytest.raises(ValueError, match="model.family='plug_family:MISTRAL' is the family of model_type 'mistral', "
                                         "but the checkpoint's config.json says model_type 'qwen2'"):
        hf.load_config(qwen, family="plug_family:MISTRAL")
    windowed = tmp_path / "windowed"
    mistral_checkpoint(windowed, sliding_window=4)
    with pytest.raises(ValueError, match="unsupported mistral settings sliding_window=4"):
        hf.load_config(windowed, family="plug_family:MISTRAL")
    # the memory planner reads the checkpoint through the family too
    from pgjax import plan as plan_lib
    assert plan_lib.main(["--model", str(tmp_path / "mistral"), "--family", "plug_family:MISTRAL", "--batch", "8",
                          "--prompt-len", "4", "--response-len", "4", "--no-search", "--group-size", "4"]) == 0
    with pytest.raises(SystemExit):
        plan_lib.main(["--model", str(tmp_path / "mistral"), "--batch", "8", "--prompt-len", "4", "--response-len", "4",
                       "--group-size", "4"])


def test_a_new_model_of_your_own_family_and_the_builtin_families(plugin, tmp_path):
    """A new random model of the user's family (the section's architecture) has its switches and saves
    under its model_type; the built-in families are Family values of the one registry; a path to
    something that is not a Family is an error naming model.family."""
    plugin("plug_family_new", FAMILY_MODULE.replace('extra_config={"sliding_window": None})',
                                                    'extra_config={"sliding_window": None}, qkv_bias=True)'))
    section = dataclasses.replace(TINY_MODEL, family="plug_family_new:MISTRAL")
    model = CausalLM(section.config(vocab_size=64), nnx.Rngs(0))
    assert model.config.qkv_bias and not model.config.qk_norm and not model.config.gemma
    assert hasattr(model.blocks()[0].attention, "q_bias")
    hf.save(model, tmp_path / "new")
    assert json.loads((tmp_path / "new" / "config.json").read_text())["model_type"] == "mistral"
    assert all(isinstance(f, Family) and family_of(name) is f for name, f in FAMILIES.items())
    assert (FAMILIES["qwen2"].qkv_bias, FAMILIES["qwen3"].qk_norm, FAMILIES["gemma3"].gemma) == (True, True, True)
    with pytest.raises(ConfigError, match="model.family='plug_family_new:NOT_A_FAMILY' is a str \\('mistral'\\), not "
                                          "a pgjax.models.transformer.Family"):
        override(Experiment(), ["model.family=plug_family_new:NOT_A_FAMILY"])


# ---------------------------------------------------------------- fingerprints

def test_every_plugged_in_module_is_fingerprinted_and_an_edited_one_refuses_resume(plugin, tmp_path):
    """inputs.json lists the source of every module named by import path (one label per key, and per
    module where a key's entries come from several); --resume refuses a run whose plugged-in module was
    edited in place, naming it."""
    task = plugin("plug_fp_task", TASK_MODULE)
    tools = plugin("plug_fp_tools", TOOL_MODULE)
    more = plugin("plug_fp_more_tools", TOOL_MODULE.replace('name = "reverse"', 'name = "backwards"'))
    sinks = plugin("plug_fp_sinks", SINK_MODULE)
    family = plugin("plug_fp_family", FAMILY_MODULE)
    exp = override(tiny_experiment(tmp_path), [
        "task.name=plug_fp_task:make", "task.tools.names=calculator,plug_fp_tools:Reverse,plug_fp_more_tools:Reverse",
        "logging.sinks=plug_fp_sinks:JsonLines", "model.family=plug_fp_family:MISTRAL",
        "algorithm.preset=plug_fp_task:make"])     # fingerprinted by its path, whatever it holds
    files = inputs.input_files(exp)
    assert {label: path for label, path in files.items() if ":module" in label} == {
        "task.name:module": task, "task.tools.names:module:plug_fp_tools": tools,
        "task.tools.names:module:plug_fp_more_tools": more, "logging.sinks:module": sinks,
        "model.family:module": family, "algorithm.preset:module": task}
    one_tool = dataclasses.replace(exp, task=dataclasses.replace(exp.task, tools="plug_fp_tools:Reverse"))
    assert inputs.input_files(one_tool)["task.tools.names:module"] == tools

    run = tiny_experiment(tmp_path, steps=2, checkpoint_every=2, eval_every=2,
                          logging=LoggingSection(tensorboard=False, sinks="plug_fp_sinks:JsonLines"),
                          task=TaskSection(name="plug_fp_task:make", options={"letter": "x"}))
    directory = train(run, progress=False)
    recorded = json.loads((directory / "inputs.json").read_text())["files"]
    assert {"task.name:module", "logging.sinks:module"} <= set(recorded)
    RunDirectory(run, resume=True)                                   # unchanged: resumes
    sinks.write_text(sinks.read_text() + "\n# an edit\n")
    with pytest.raises(ConfigError, match=f"--resume: an input of {directory} changed since the run began "
                                          f"\\(logging.sinks:module: {sinks} holds other bytes"):
        RunDirectory(run, resume=True)
