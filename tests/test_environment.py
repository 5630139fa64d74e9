"""Tool calls and the tool environment (pgjax.agents.environment), on the host: both call conventions
parse what a model writes, a malformed call is an error observation (never an exception), the first
reply without a call is the scored final answer, and a template that takes tools describes them."""
import json

import pytest
from test_chat_prompts import chatml_tokenizer

from pgjax.agents import Calculator, PythonSandbox
from pgjax.agents.environment import JsonCalls, TaggedCalls, ToolCall, ToolEnvironment, call_format_for
from pgjax.rollout.collect import PromptFormat

TOOLS = (Calculator(), PythonSandbox())


@pytest.mark.parametrize("reply, calls, errors", [
    ("I will compute <calculator>12*7</calculator>", [ToolCall("calculator", "12*7")], []),
    ("<calculator> 1+1 </calculator> and <python>print(2)</python>",
     [ToolCall("calculator", "1+1"), ToolCall("python", "print(2)")], []),
    ("<python>\nfor i in range(3):\n    print(i)\n</python>",
     [ToolCall("python", "for i in range(3):\n    print(i)")], []),
    ("the answer is 84", [], []),
    ("<b>bold</b> is not a tool", [], []),
    ("<calculator>12*7", [], ["error: <calculator> is not closed with </calculator>"]),
    ("<calculator>1</calculator><calculator>2", [ToolCall("calculator", "1")],
     ["error: <calculator> is not closed with </calculator>"]),
])
def test_tagged_calls(reply, calls, errors):
    assert TaggedCalls().parse(reply, TOOLS) == (calls, errors)


@pytest.mark.parametrize("reply, calls, errors", [
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>',
     [ToolCall("calculator", "12*7")], []),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": 12}}</tool_call>', [],
     ['error: calculator takes {"expression": "..."}']),
    ('<tool_call>{"name": "shell", "arguments": {}}</tool_call>', [], ["error: no tool named 'shell'"]),
    ("<tool_call>{name: calculator}</tool_call>", [], ["error: the tool call is not JSON (Expecting property name "
                                                       "enclosed in double quotes)"]),
    ('<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}', [],
     ["error: <tool_call> is not closed with </tool_call>"]),
    ("84", [], []),
])
def test_json_calls(reply, calls, errors):
    assert JsonCalls().parse(reply, TOOLS) == (calls, errors)


def test_the_convention_follows_the_template():
    assert isinstance(call_format_for("{% for m in messages %}{{ m.content }}{% endfor %}"), TaggedCalls)
    assert isinstance(call_format_for(None), TaggedCalls)
    assert isinstance(call_format_for("...<tool_call>\n{{ tool_call | tojson }}\n</tool_call>..."), JsonCalls)


def test_a_tool_environment_answers_calls_and_scores_the_final_answer():
    environment = ToolEnvironment([Calculator()], lambda example, reply: float(example["answer"] in reply),
                                  invalid_call_reward=-0.1)
    opening = environment.reset({"prompt": "What is 347*29?", "answer": "10063"})
    assert [m["role"] for m in opening] == ["system", "user"]
    assert "<calculator>...</calculator>" in opening[0]["content"]
    assert opening[1]["content"] == "What is 347*29?"
    step = environment.step("Let me compute <calculator>347*29</calculator>")
    assert step.observation == [{"role": "user", "content": "<result>10063</result>"}] and not step.done
    assert step.reward is None and step.info == {"calls": 1, "valid_calls": 1}
    step = environment.step("<calculator>347*</calculator>")                     # a call that fails
    assert step.observation[0]["content"].startswith("<result>error: expected a number")
    assert step.info == {"calls": 1, "valid_calls": 0} and step.reward is None
    step = environment.step("<calculator>347*29")                                # a malformed call
    assert step.observation[0]["content"] == "error: <calculator> is not closed with </calculator>"
    assert step.reward == -0.1 and step.info == {"calls": 1, "valid_calls": 0}
    step = environment.step("The answer is 10063.")
    assert step.done and step.reward == 1.0 and step.observation is None
    with pytest.raises(ValueError, match="distinct names"):
        ToolEnvironment([Calculator(), Calculator()], lambda e, r: 0.0)
    with pytest.raises(RuntimeError, match="before reset"):
        ToolEnvironment([Calculator()], lambda e, r: 0.0).step("x")


TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools: {% for t in tools %}{{ t.function.name }}({{ t.function.parameters."
    "required[0] }}) {% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'tool' %}<tool_response>{{ m['content'] }}"
    "</tool_response>{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{# <tool_call> #}")


def test_a_template_that_takes_tools_describes_them_and_renders_their_results():
    tokenizer = chatml_tokenizer(TOOL_TEMPLATE)
    calls = call_format_for(tokenizer.chat_template)
    assert isinstance(calls, JsonCalls) and calls.tool_prompt(TOOLS) == ""
    prompt_format = PromptFormat(chat=True, tools=json.dumps(JsonCalls.schemas(TOOLS)))
    environment = ToolEnvironment(TOOLS, lambda example, reply: 0.0, calls=calls)
    turns = environment.reset({"prompt": "2+2?"})
    assert turns == [{"role": "user", "content": "2+2?"}]
    text = prompt_format.render_turns(tokenizer, turns)
    assert text.startswith("<|im_start|>system\ntools: calculator(expression) python(code) <|im_end|>")
    step = environment.step('<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>')
    assert step.observation == [{"role": "tool", "content": "4"}]
    reply = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    continuation = prompt_format.continuation(tokenizer, turns, reply, "<|im_end|>", step.observation)
    assert continuation == "\n<|im_start|>tool\n<tool_response>4</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_rewrites_the_reply_cannot_continue_an_episode():
    tokenizer = chatml_tokenizer("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}"
                                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                                 "{% endif %}")
    with pytest.raises(ValueError, match="does not render an assistant reply as written"):
        PromptFormat(chat=True).continuation(tokenizer, [{"role": "user", "content": "x"}], " 4 ", "",
                                             [{"role": "user", "content": "ok"}])
