"""benchmarks/compare_tunix.py's harness without tunix: what the tunix child is given (the job, the tokenizer
adapter, the reward) says the same as pgjax's side, and a child's arguments parse back to the parent's."""
import dataclasses
import json
import types

import numpy as np
from helpers import load_script

from pgjax.rollout.collect import PLAIN
from pgjax.tasks import ArithmeticTask, arithmetic_reward

benchmark = load_script("benchmarks", "compare_tunix")
TASK = ArithmeticTask(digits=3)


def test_prompt_tokenizer_feeds_tunix_pgjax_rendering():
    tokenizer = TASK.tokenizer()
    adapter = benchmark.PromptTokenizer(tokenizer, PLAIN)
    prompts = [e["prompt"] for e in TASK.examples(3, 0)]
    assert [adapter.encode(p) for p in prompts] == PLAIN.token_ids(tokenizer, prompts)
    assert adapter.encoded == PLAIN.token_ids(tokenizer, prompts)
    assert adapter.bos_id() is None          # tunix would prepend a BOS the rendering does not have
    ids = adapter.encoded[0]
    assert adapter.decode([*ids, adapter.eos_id(), adapter.pad_id()]) == prompts[0]


def test_tunix_job_is_json_and_names_the_same_reward_and_format():
    examples = TASK.examples(2, 0)
    work = types.SimpleNamespace(directory="model", prompt_format=dataclasses.replace(PLAIN, system_prompt="Add."),
                                 reward=arithmetic_reward, prompt_width=8, samples=4, new_tokens=16)
    job = json.loads(json.dumps(benchmark.tunix_job(work, [examples], types.SimpleNamespace(seed=3))))
    assert benchmark.reward_function(job["reward"]) is arithmetic_reward
    assert benchmark.PromptFormat(**job["prompt_format"]) == work.prompt_format
    assert job["plan"] == [examples] and job["seed"] == 3


def test_tunix_reward_ignores_tunix_extra_fields():
    examples = TASK.examples(4, 1)
    prompts = np.array([e["prompt"] for e in examples])
    completions = [str(examples[0]["target"]), "no", "12", str(examples[3]["target"])]
    targets = np.array([e["target"] for e in examples])
    rewards = benchmark.tunix_reward(arithmetic_reward)(prompts, completions, target=targets, mode="train",
                                                        trajectory_ids=["0_0", "0_1", "0_2", "0_3"])
    assert rewards == list(np.asarray(arithmetic_reward(list(prompts), completions, target=list(targets)), float))
    assert rewards[0] == rewards[3] == 1.0


def test_child_arguments_parse_back():
    args = benchmark.parse(["--model", "models/m", "--steps", "3", "--warmup", "1", "--samples", "4",
                            "--new-tokens", "32", "--seed", "2"])
    child = benchmark.parse(benchmark.child_argv(args, "tunix", "job.json"))
    assert child.only == "tunix" and child.job == "job.json" and child.plan_steps == 4
    for name in ("model", "steps", "warmup", "samples", "new_tokens", "seed", "lengths"):
        assert getattr(child, name) == getattr(args, name)
