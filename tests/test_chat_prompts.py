"""Prompts through a chat template: the rendered text, the end-of-turn token, rollouts that stop
there with the template's tokens outside the response, and rewards that see only the task's prompt
and the assistant's text."""
import json

import jax
import numpy as np
import pytest
import tokenizers
import transformers
from flax import nnx
from helpers import tiny_experiment

from pgjax import config as config_lib
from pgjax.config import ConfigError, PromptSection, TaskSection
from pgjax.models import hf
from pgjax.models.transformer import CausalLM, ModelConfig
from pgjax.rollout.collect import (
    PLAIN,
    PromptFormat,
    RolloutConfig,
    collect,
    encode_prompts,
    prompt_format_for,
    stop_tokens,
)
from pgjax.tasks import Conversation, per_example
from pgjax.train.trainer import Trainer

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chatml_tokenizer(template=CHATML, chars="0123456789+-=? abcdefghijklmnopqrstuvwxyz\n"):
    """A character tokenizer of ``chars`` with ChatML's two special tokens (and an <eos> that is not the
    end of turn)."""
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    tokenizer.decoder = tokenizers.decoders.Fuse()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<pad>",
                                                additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = template
    return fast


def test_a_prompt_is_rendered_as_the_user_turn_after_the_system_prompt():
    tokenizer = chatml_tokenizer()
    assert PromptFormat(chat=True, system_prompt="be brief").render(tokenizer, ["1+2=?"]) == [
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n1+2=?<|im_end|>\n<|im_start|>assistant\n"]
    assert PromptFormat(chat=True).render(tokenizer, ["x"]) == [
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"]
    assert PLAIN.render(tokenizer, ["x"]) == ["x"]
    tokens, mask = encode_prompts(tokenizer, ["x"], 24, PromptFormat(chat=True))
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert mask.sum() == 1 + 4 + 1 + 1 + 1 + 1 + 1 + 9 + 1 and tokens[0, 4] == start     # "user", "assistant"
    with pytest.raises(ValueError, match="prompts must have 1..8 tokens"):
        encode_prompts(tokenizer, ["x"], 8, PromptFormat(chat=True))        # the template's tokens count


def test_a_conversation_is_rendered_with_its_own_turns():
    tokenizer = chatml_tokenizer()
    turn = lambda role, content: {"role": role, "content": content}     # noqa: E731
    chat = Conversation([turn("user", "1+2=?"), turn("assistant", "3"), turn("user", "and 2+2=?")])
    assert PromptFormat(chat=True).render(tokenizer, [chat]) == [
        "<|im_start|>user\n1+2=?<|im_end|>\n<|im_start|>assistant\n3<|im_end|>\n<|im_start|>user\nand 2+2=?<|im_end|>\n"
        "<|im_start|>assistant\n"]
    with_system = PromptFormat(chat=True, system_prompt="be brief").render(tokenizer, [chat])[0]
    assert with_system.startswith("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n1+2=?")
    own = Conversation([turn("system", "S"), turn("user", "x")])
    assert PromptFormat(chat=True, system_prompt="be brief").render(tokenizer, [own]) == [
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"]   # its own wins
    assert PLAIN.render(tokenizer, [Conversation([turn("user", "x"), turn("assistant", "y")]), "z"]) == ["x", "z"]
    with pytest.raises(ValueError, match="a conversation of 3 messages needs a chat template"):
        PLAIN.render(tokenizer, [chat])


def test_the_prompt_format_and_stop_tokens_follow_the_tokenizer_and_the_task_options(tmp_path):
    tokenizer = chatml_tokenizer()
    assert prompt_format_for(tokenizer, "auto", "S") == PromptFormat(chat=True, system_prompt="S")
    assert prompt_format_for(tokenizer, "none") == PLAIN
    no_template = chatml_tokenizer(None)
    assert prompt_format_for(no_template, "auto") == PLAIN
    with pytest.raises(ValueError, match=r"system_prompt is set .* \(the tokenizer has no chat template\)"):
        prompt_format_for(no_template, "auto", "S")
    end, eos = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, 7]}))
    assert stop_tokens(tokenizer, PromptFormat(chat=True), [tmp_path]) == ((end, eos, 7), end)
    assert stop_tokens(tokenizer, PLAIN, [tmp_path, ""]) == ((eos, 7), eos)


def test_the_end_of_turn_token_is_found_in_the_template():
    tokenizer = chatml_tokenizer()
    assert hf.end_of_turn_ids(tokenizer) == (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    plain_end = chatml_tokenizer("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    assert hf.end_of_turn_ids(plain_end) == ()


def test_a_rollout_stops_at_the_end_of_turn_and_rewards_see_only_the_assistant_text():
    tokenizer = chatml_tokenizer()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = ModelConfig(family="qwen3", vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    policy = CausalLM(config, nnx.Rngs(0))      # random: about one response in three samples the end of turn
    seen = {}

    @per_example
    def record(prompt, completion, **_):
        seen.setdefault("pairs", []).append((prompt, completion))
        return 0.0

    examples = [{"prompt": f"{a}+1=?", "answer": str(a + 1)} for a in range(4)]
    rollout, stats = collect(policy, tokenizer, examples, record, record, jax.random.PRNGKey(0),
                             RolloutConfig(samples_per_prompt=8, max_prompt_tokens=24, max_new_tokens=24),
                             eos_ids=(end, tokenizer.eos_token_id), prompt_format=PromptFormat(chat=True))
    response = np.asarray(rollout.tokens)[:, 24:]
    lengths = stats["length"]
    stopped = [i for i in range(32) if lengths[i] and response[i, lengths[i] - 1] == end]
    assert len(stopped) >= 4                                # some responses ended their turn
    mask = np.asarray(rollout.mask)
    for i in range(32):
        assert mask[i].sum() == lengths[i] and (mask[i, :lengths[i]] == 1).all()
        assert end not in response[i, :max(lengths[i] - 1, 0)]                 # nothing after the first stop
    prompts, completions = zip(*seen["pairs"][:32], strict=True)
    assert list(prompts) == [e["prompt"] for e in examples for _ in range(8)]   # the task's prompt, no template
    for i in stopped:
        assert completions[i] == tokenizer.decode(response[i, :lengths[i] - 1])   # without the end of turn
        assert "<|im_end|>" not in completions[i]


def checkpoint_with_chat_template(directory, tokenizer):
    config = ModelConfig(family="qwen3", vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    hf.save(CausalLM(config, nnx.Rngs(0)), directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.mark.slow
def test_the_trainer_renders_prompts_and_stops_at_the_end_of_turn(tmp_path):
    tokenizer = chatml_tokenizer()
    model = checkpoint_with_chat_template(tmp_path / "model", tokenizer)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1=?", "answer": a + 1}) + "\n" for a in range(8)))
    base = tiny_experiment(
        tmp_path,
        model=config_lib.ModelSection(path=str(model)),
        task=TaskSection(
            name="jsonl_math", options={"path": str(data)}, prompt=PromptSection(system_prompt="be brief")
        ),
        rollout=RolloutConfig(samples_per_prompt=2, max_prompt_tokens=48, max_new_tokens=4),
    )
    trainer = Trainer(base)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert trainer.context.prompt_format == PromptFormat(chat=True, system_prompt="be brief")
    assert (trainer.context.eos_ids[0] == end and tokenizer.eos_token_id in trainer.context.eos_ids
            and trainer.context.end_id == end)
    record = trainer.step()
    assert record["step"] == 1 and record["skipped_updates"] == 0
    plain = Trainer(config_lib.override(base, ["task.prompt.chat_template=none", "task.prompt.system_prompt="]))
    assert plain.context.prompt_format == PLAIN and plain.context.eos_ids == (tokenizer.eos_token_id,)
    with pytest.raises(ConfigError, match=r"task.prompt.system_prompt is set but the prompts are plain text "
                                          r"\(task.prompt.chat_template='none'\)"):
        Trainer(config_lib.override(base, ["task.prompt.chat_template=none"]))
    with pytest.raises(ConfigError, match="rollout.max_prompt_tokens=20"):   # the template's tokens count
        Trainer(config_lib.override(base, ["rollout.max_prompt_tokens=20"]))
    with pytest.raises(ConfigError, match="task.prompt.chat_template='chatml' is invalid: one of auto, none"):
        config_lib.override(base, ["task.prompt.chat_template=chatml"])


def test_plain_prompts_get_the_tokenizers_bos_and_templated_ones_only_the_templates():
    """A base model such as Gemma 3 needs its <bos> on plain text (the tokenizer adds it); a chat
    template writes its own, so the rendered text is not given a second one."""
    tokenizer = chatml_tokenizer("{{ bos_token }}" + CHATML)
    tokenizer.add_special_tokens({"bos_token": "<bos>"})
    tokenizer._tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", tokenizer.bos_token_id)])
    bos = tokenizer.bos_token_id
    assert PLAIN.token_ids(tokenizer, ["ab"]) == [[bos, *tokenizer("ab", add_special_tokens=False)["input_ids"]]]
    tokens, mask = encode_prompts(tokenizer, ["ab"], 4)
    assert tokens[0, 1:].tolist() == PLAIN.token_ids(tokenizer, ["ab"])[0] and mask.tolist() == [[0, 1, 1, 1]]
    chat = PromptFormat(chat=True).token_ids(tokenizer, ["ab"])[0]
    assert chat[0] == bos and chat.count(bos) == 1          # the template's own, not a second one
    rendered = PromptFormat(chat=True).render(tokenizer, ["ab"])
    assert chat == tokenizer(rendered, add_special_tokens=False)["input_ids"][0]


def test_a_prompt_template_writes_the_prompt_plain_or_as_the_user_turn():
    tokenizer = chatml_tokenizer()
    template = "q: {prompt}\na:"
    assert PromptFormat(template=template).render(tokenizer, ["1+2=?"]) == ["q: 1+2=?\na:"]
    assert PromptFormat(chat=True, template=template).render(tokenizer, ["1+2=?"]) == [
        "<|im_start|>user\nq: 1+2=?\na:<|im_end|>\n<|im_start|>assistant\n"]
    turn = lambda role, content: {"role": role, "content": content}     # noqa: E731
    chat = Conversation([turn("user", "1+2=?"), turn("assistant", "3"), turn("user", "2+2=?")])
    assert PromptFormat(chat=True, template=template).render(tokenizer, [chat])[0].count("q: ") == 1   # the last turn
    assert prompt_format_for(tokenizer, "none", prompt_template=template) == PromptFormat(template=template)
    for bad in ("no placeholder", "{prompt} {prompt}"):
        with pytest.raises(ConfigError, match="task.prompt.template=.* is invalid: a text holding {prompt} once"):
            TaskSection(prompt=PromptSection(template=bad))


def test_stop_text_ends_a_response_at_every_token_that_holds_it():
    from pgjax.rollout.collect import text_tokens
    tokenizer = chatml_tokenizer()
    newline = tokenizer.convert_tokens_to_ids("\n")
    assert PromptSection(stop_text="\\n,=").stop_texts == ("\n", "=")
    assert text_tokens(tokenizer, ("\n", "=")) == (newline, tokenizer.convert_tokens_to_ids("="))
    eos_ids, end_id = stop_tokens(tokenizer, PLAIN, stop_texts=("\n",))
    assert eos_ids == (tokenizer.eos_token_id, newline) and end_id == tokenizer.eos_token_id
    with pytest.raises(ValueError, match="no token of the tokenizer holds '#'"):
        text_tokens(tokenizer, ("#",))
    with pytest.raises(ConfigError, match="task.prompt.stop_text='a,,b' is invalid: comma-separated texts, none empty"):
        TaskSection(prompt=PromptSection(stop_text="a,,b"))


def test_the_command_lines_escapes_are_read_in_the_prompt_template_and_stop_text(tmp_path):
    sets = ["task.prompt.template=Q: {prompt}\\nA:", "task.prompt.stop_text=\\n"]
    task = config_lib.override(tiny_experiment(tmp_path), sets).task
    assert task.prompt.frame == "Q: {prompt}\nA:" and task.prompt.stop_texts == ("\n",)
