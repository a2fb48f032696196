"""Tool-call parsers: well-formed calls, malformed JSON, OpenAI function-calling JSON."""

from __future__ import annotations

import pytest

from rollout_svc.agent.parsers import HermesParser, OpenAIParser, ToolCallParser, get_parser


def test_hermes_parses_calls_and_content() -> None:
    p = HermesParser()
    t = p.parse('Let me compute.<tool_call>{"name": "calc", "arguments": {"expr": "2+3"}}</tool_call>'
                '<tool_call>\n{"name": "calc", "arguments": "{\\"expr\\": \\"4*5\\"}"}\n</tool_call>')
    assert [(c.name, c.arguments) for c in t.calls] == [("calc", {"expr": "2+3"}), ("calc", {"expr": "4*5"})]
    assert t.errors == [] and t.content == "Let me compute." and t.wants_tools


def test_hermes_no_call_is_an_answer() -> None:
    t = HermesParser().parse("The answer is 42.")
    assert not t.wants_tools and t.content == "The answer is 42."


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ('<tool_call>{"name": "calc", "arguments": {"expr": "2+3"}</tool_call>', "not valid JSON"),
        ("<tool_call>calc(2+3)</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "needs a non-empty string 'name'"),
        ('<tool_call>{"name": "calc", "arguments": [1, 2]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "calc", "arguments": "{not json"}</tool_call>', "arguments of 'calc' are not valid JSON"),
        ('<tool_call>["calc"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "calc", "arguments": {"expr": "1"', "not valid JSON"),  # unclosed, cut by the budget
        ("<tool_call>" + "[" * 100000 + "</tool_call>", ""),
    ],
)
def test_hermes_malformed_json_is_an_error_not_an_exception(bad: str, fragment: str) -> None:
    t = HermesParser().parse("before " + bad)
    assert t.calls == [] and len(t.errors) == 1 and t.wants_tools
    assert fragment in t.errors[0].message


def test_hermes_keeps_good_calls_beside_bad_ones() -> None:
    t = HermesParser().parse('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>')
    assert [c.name for c in t.calls] == ["a"] and len(t.errors) == 1


def test_openai_function_calling_json() -> None:
    p = OpenAIParser()
    msg = ('Sure. {"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", '
           '"arguments": "{\\"expr\\": \\"6*7\\"}"}}]}')
    t = p.parse(msg)
    assert [(c.name, c.arguments) for c in t.calls] == [("calc", {"expr": "6*7"})] and t.content == "Sure."
    t = p.parse('[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]')
    assert [c.name for c in t.calls] == ["a", "b"]
    assert not p.parse('just text {"x": 1} and [1, 2]').wants_tools


def test_openai_malformed() -> None:
    p = OpenAIParser()
    t = p.parse('{"tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": "{bad"}}]}')
    assert t.calls == [] and "not valid JSON" in t.errors[0].message
    t = p.parse('{"tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": "{}"')  # cut off
    assert t.calls == [] and t.errors and "could not be parsed" in t.errors[0].message


def test_get_parser_by_name_and_dotted_path() -> None:
    assert isinstance(get_parser("hermes"), HermesParser)
    assert isinstance(get_parser("openai"), OpenAIParser)
    assert isinstance(get_parser("tests.agent_tools.CallOnce"), ToolCallParser)
    with pytest.raises(ValueError, match="unknown parser"):
        get_parser("xml")
    with pytest.raises(ValueError, match="cannot import"):
        get_parser("tests.agent_tools.Nope")
    with pytest.raises(ValueError, match="not a ToolCallParser"):
        get_parser("tests.agent_tools.Echo")
