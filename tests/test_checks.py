"""The one validation path (``pgjax.checks``): every configuration section of every layer says a bad
value in one ``ConfigError`` line naming its dotted key, the value and what is valid."""
import dataclasses

import pytest

from pgjax.checks import ConfigError, check_types, fits, require
from pgjax.config import (
    AlgorithmSection,
    DistributedConfig,
    Experiment,
    LoggingSection,
    LoRASection,
    MeshConfig,
    ModelSection,
    OptimConfig,
    PromptSection,
    RewardModelSection,
    RewardSection,
    RolloutConfig,
    TaskSection,
    ToolsSection,
    UpdateConfig,
    WarmStartSection,
    override,
)
from pgjax.config.keys import section_types
from pgjax.models.lora import LoRAConfig
from pgjax.models.transformer import ModelConfig
from pgjax.sample import Decoding, SamplingConfig

ARCHITECTURE = dict(family="qwen3", vocab_size=11, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=4)

# (section, a bad setting, the key its error names, the start of what is valid)
OUT_OF_RANGE = [
    (Experiment, dict(steps=-1), "steps", "an integer >= 0"),
    (AlgorithmSection, dict(correction="always"), "algorithm.correction", "one of"),
    (ModelSection, dict(hidden_size=0), "model.hidden_size", "an integer >= 1"),
    (LoRASection, dict(rank=-1), "model.lora.rank", "an integer >= 0"),
    (TaskSection, dict(name=""), "task.name", "a registered task"),
    (PromptSection, dict(template="no placeholder"), "task.prompt.template", "a text holding {prompt} once"),
    (RewardSection, dict(timeout=-1.0), "task.reward.timeout", "finite seconds >= 0"),
    (ToolsSection, dict(names="shell"), "task.tools.names", "comma-separated tools"),
    (RolloutConfig, dict(temperature=0.0), "rollout.temperature", "a finite number > 0"),
    (UpdateConfig, dict(epochs=0), "update.epochs", "an integer >= 1"),
    (OptimConfig, dict(lr=0.0), "OptimConfig.lr", "a finite number > 0"),
    (WarmStartSection, dict(batch_size=0), "warm_start.batch_size", "an integer >= 1"),
    (LoggingSection, dict(progress_every=-1.0), "logging.progress_every", ">= 0 seconds"),
    (MeshConfig, dict(data=0), "mesh.data", "an integer >= 1, or -1"),
    (DistributedConfig, dict(initialize="maybe"), "distributed.initialize", "one of auto, on, off"),
    (RewardModelSection, dict(max_tokens=1), "reward_model.max_tokens", "an integer >= 2"),
    (ModelConfig, dict(ARCHITECTURE, rms_norm_eps=0.0), "model.rms_norm_eps", "> 0"),
    (LoRAConfig, dict(rank=0), "model.lora.rank", "an integer >= 1"),
    (Decoding, dict(top_p=0.0), "top_p", "in (0, 1]"),
    (SamplingConfig, dict(eos_ids=(0,), n=0), "n", "an integer >= 1"),
]


@pytest.mark.parametrize("section, setting, key, valid", OUT_OF_RANGE, ids=lambda v: getattr(v, "__name__", None))
def test_every_section_names_the_key_of_a_value_out_of_range(section, setting, key, valid):
    with pytest.raises(ConfigError) as error:
        section(**setting)
    value = setting[key.rsplit(".", 1)[-1]]
    assert str(error.value).startswith(f"{key}={value!r} is invalid: {valid}")
    assert (error.value.key, error.value.value) == (key, value) and error.value.valid.startswith(valid)


def test_every_section_of_an_experiment_is_checked_here():
    """A section added to ``Experiment`` joins ``OUT_OF_RANGE`` (each has a range check of its own)."""
    assert section_types() <= {section for section, *_ in OUT_OF_RANGE}


@pytest.mark.parametrize("section, setting, key, expected", [
    (Experiment, dict(seed=True), "seed", "an int is expected"),
    (RolloutConfig, dict(samples_per_prompt=8.0), "rollout.samples_per_prompt", "an int is expected"),
    (UpdateConfig, dict(temperature="1"), "update.temperature", "a number is expected"),
    (OptimConfig, dict(lr="1e-3"), "OptimConfig.lr", "a number is expected"),
    (MeshConfig, dict(fsdp=2.0), "mesh.fsdp", "an int is expected"),
    (DistributedConfig, dict(num_processes="2"), "distributed.num_processes", "an int is expected"),
    (PromptSection, dict(stop_text=None), "task.prompt.stop_text", "a str is expected"),
    (RewardSection, dict(model_weight=True), "task.reward.model_weight", "a number is expected"),
    (TaskSection, dict(options=[]), "task.options", "a dict is expected"),
    (TaskSection, dict(reward=len), "task.reward.function", "a str is expected"),
])
def test_every_section_names_the_key_of_a_value_of_the_wrong_type(section, setting, key, expected):
    with pytest.raises(ConfigError, match=f"^{key}=.* is invalid: {expected}$"):
        section(**setting)


def test_a_section_at_several_keys_is_named_by_the_key_the_command_line_set():
    """``OptimConfig`` sits at three keys, so its own message names its type; ``--set`` names the key set."""
    for key in ("optim.lr", "critic_optim.lr", "warm_start.optim.lr"):
        with pytest.raises(ConfigError) as error:
            override(Experiment(), [f"{key}=0"])
        assert str(error.value) == f"{key}=0.0 is invalid: a finite number > 0" and error.value.key == key


def test_the_helpers():
    require(True, "a.b", 1, "anything")
    with pytest.raises(ConfigError, match=r"^a\.b=0 is invalid: an integer >= 1$"):
        require(False, "a.b", 0, "an integer >= 1")
    assert fits(3, float) and not fits(True, int) and not fits(1.5, int) and fits(None, int | None)

    @dataclasses.dataclass
    class Section:
        count: int = 1
        inner: RolloutConfig = RolloutConfig()

    check_types(Section(), "s.")
    with pytest.raises(ConfigError, match=r"^s\.inner=3 is invalid: RolloutConfig\(\.\.\.\) is expected$"):
        check_types(Section(inner=3), "s.")
