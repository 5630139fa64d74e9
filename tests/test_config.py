"""The task section's parts and an experiment record of the flat task section read in them
(``pgjax.config.upgraded``)."""
import pathlib

import pytest

from pgjax.config import ConfigError, Experiment, RewardSection, TaskSection, override, upgraded, valid_keys
from pgjax.config.keys import TASK_OPTIONS
from pgjax.eval import saved_experiment
from pgjax.train.run_dir import experiment_record

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the flat task section of an earlier experiment.json, every field at its default then
FLAT = {"name": "arithmetic", "digits": 2, "ops": "+", "max_scratch": 8, "working": "before", "count": 3, "path": "",
        "prompt_field": "question", "answer_field": "answer", "extra_fields": "", "file_format": "auto",
        "skip_invalid": False, "word_share": 0.5, "answer_from": "boxed_or_last_number", "held_out": "none",
        "reward": "", "format_weight": 0.0, "chat_template": "auto", "system_prompt": "",
        "prompt_template": "{prompt}", "stop_text": "", "reward_timeout": 0.0, "tools": "", "reward_model": "",
        "reward_model_weight": 1.0, "reward_model_normalize": "none", "verifier_weight": 1.0, "options": {}}


def test_a_flat_record_is_read_as_the_record_of_the_same_experiment_today():
    assert upgraded({"task": FLAT})["task"] == upgraded(experiment_record(Experiment()))["task"]


@pytest.mark.parametrize("flat, task", [
    ({"digits": 3}, TaskSection(options={"digits": 3})),
    ({"name": "word_math"}, TaskSection(name="word_math", options={"ops": "+"})),     # the section's old default
    ({"name": "countdown", "count": 4, "digits": 2}, TaskSection(name="countdown", options={"count": 4})),
    ({"reward": "pkg:fn", "reward_timeout": 5.0}, TaskSection(reward=RewardSection(function="pkg:fn", timeout=5.0))),
    ({"tools": "calculator", "name": "word_math", "ops": "+"}, TaskSection(name="word_math", tools="calculator",
                                                                          options={"ops": "+"})),
])
def test_each_flat_field_moves_to_its_part_and_an_option_at_its_default_is_left_out(flat, task):
    record = upgraded({"task": {**FLAT, **flat}})["task"]
    assert record == upgraded(experiment_record(Experiment(task=task)))["task"]


def test_a_task_that_does_not_resolve_keeps_every_flat_option():
    """Which options a task of the user's takes is its factory's to say: where it does not import,
    every flat field is kept, so a resume names each one that is not set the same way."""
    record = upgraded({"task": {**FLAT, "name": "pkg.tasks:make", "options": {"letter": "b"}}})["task"]
    assert record["options"] == {**{name: FLAT[name] for name in TASK_OPTIONS}, "letter": "b"}


def test_the_parts_are_keys_and_an_old_key_names_the_new_one():
    keys = valid_keys()
    assert {"task.options", "task.prompt.template", "task.reward.function", "task.reward.model",
            "task.tools.names"} <= set(keys)
    assert not {"task.digits", "task.prompt_template", "task.reward_model"} & set(keys)
    for old, new in (("task.digits", "task.options.digits"), ("task.prompt_template", "task.prompt.template"),
                     ("task.reward", "task.reward.function"), ("task.tools", "task.tools.names"),
                     ("task.dataset", "task.options.path")):
        with pytest.raises(ConfigError, match=f"unknown config key '{old}'; did you mean {new}\\?"):
            override(Experiment(), [f"{old}=x"])
    task = override(Experiment(), ["task.options.digits=3", "task.prompt.template=Q: {prompt}",
                                   "task.reward.timeout=5", "task.tools.names=calculator"]).task
    assert (task.options, task.prompt.template, task.reward.timeout, task.tools.listed) == (
        {"digits": 3}, "Q: {prompt}", 5.0, ("calculator",))


def test_an_option_takes_its_factorys_default_unless_set():
    assert TaskSection().resolved_options() == {"digits": 2, "ops": "+"}
    assert TaskSection(name="word_math", options={"digits": 3}).option("ops") == "+-*"
    assert TaskSection().option("held_out", "none") == "none"
    with pytest.raises(ConfigError, match="task.name='chess'"):
        TaskSection(name="chess").resolved_options()


def test_a_committed_run_record_of_the_flat_section_loads_for_evaluation():
    """``experiments/results/smollm2_reward_model/experiment.json`` (written with the flat task section)
    is read by ``pgjax.eval`` as today's sections."""
    saved = saved_experiment(ROOT / "experiments" / "results" / "smollm2_reward_model" / "experiment.json")
    assert saved.task == TaskSection() and saved.seed == 0
