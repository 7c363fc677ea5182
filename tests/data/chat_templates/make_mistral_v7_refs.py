#!/usr/bin/env python3
"""Prints the reference renderings that src/tokenizer/chat_template_test.cpp
compares mistral-v7 and mistral-v7-tekken against, rendered by jinja2 (HF
transformers' semantics: trim_blocks, lstrip_blocks, raise_exception,
strftime_now) from published Mistral chat templates. The templates are not kept
in this repository; pass their files:

  python3 make_mistral_v7_refs.py LARGE2411.jinja SMALL31.jinja [SMALL32.jinja]

LARGE2411: mistralai/Mistral-Large-Instruct-2411's "v7" template as llama.cpp's
  tests/test-chat-template.cpp quotes it (commit c392e50, the "mistralai 'v7'
  template" case). It writes no default system message.
SMALL31: mistralai/Mistral-Small-3.1-24B-Instruct-2503's chat template as
  llama.cpp keeps it (ggml-org/llama.cpp, models/templates/
  mistralai-Mistral-Small-3.1-24B-Instruct-2503.jinja, commit 9190da22).
SMALL32: mistralai/Mistral-Small-3.2-24B-Instruct-2506's template (optional;
  it also takes a system message after the first one). Our copy came from a
  third-party script that embeds it for an mlx-lm server, not from the model
  repository itself.

The tools case (chat_template_test.cpp's mistral_conversation() and
mistral_tools(), one call id longer than 9 characters) is rendered by SMALL31.

Only conversations that open with a system message are compared: without one
the templates write their dated default system message, which Spillway (like
llama.cpp without --jinja) does not inject. The last case shows that text.
"""
import datetime
import json
import sys

import jinja2


def render(template_text, messages, tools=None):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True,
                             extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    # transformers' own tojson (jinja2's sorts keys and escapes HTML).
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    extra = {} if tools is None else {"tools": tools}
    return env.from_string(template_text).render(messages=messages, bos_token="<s>", eos_token="</s>",
                                                 add_generation_prompt=True, **extra)


def cpp(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


CASES = {
    "conversation": [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "  Hi there  "},
        {"role": "user", "content": "Who are you"},
    ],
    "system_user": [
        {"role": "system", "content": " S \n"},
        {"role": "user", "content": "\tU "},
    ],
}
LATER_SYSTEM = [
    {"role": "system", "content": "S1"},
    {"role": "user", "content": "U1"},
    {"role": "assistant", "content": "A1"},
    {"role": "system", "content": "S2"},
    {"role": "user", "content": "U2"},
]

# chat_template_test.cpp's mistral_conversation() and mistral_tools().
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city, now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City \u2014 name"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "parameters": {}, "strict": True}},
]
TOOL_CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": " Weather in Paris and the time? "},
    {"role": "assistant", "tool_calls": [
        {"id": "abcDEF123", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "\u00b0C"}}},
        {"id": "call_7_Z9y8X7w6V", "type": "function", "function": {"name": "now", "arguments": {}}}]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "{\"temp\": 21}"},
    {"role": "tool", "tool_call_id": "call_7_Z9y8X7w6V", "content": "line1\nline2 \"q\""},
    {"role": "assistant", "content": "  21 C, 10:00.  "},
    {"role": "user", "content": "Thanks"},
]

large = open(sys.argv[1]).read()
for name, msgs in CASES.items():
    print(f"large2411 {name}: {cpp(render(large, msgs))}")
print(f"large2411 later_system: {cpp(render(large, LATER_SYSTEM))}")
print(f"large2411 no_system: {cpp(render(large, CASES['conversation'][1:]))}")
# llama.cpp's copy writes each "\n" escape of the original's string literals
# as a backslash before a real newline, which jinja2 reads as a line
# continuation (the default message would lose its line breaks, the tool
# preamble its "\n\n" before the system message); put the escapes back.
small31 = open(sys.argv[2]).read().replace("\\\n", "\\n")
for name, msgs in CASES.items():
    print(f"small31 {name}: {cpp(render(small31, msgs))}")
print(f"small31 tools: {cpp(render(small31, TOOL_CONVERSATION, TOOLS))}")
print(f"small31 tools_first_turn: {cpp(render(small31, TOOL_CONVERSATION[:2], TOOLS))}")
if len(sys.argv) > 3:
    small32 = open(sys.argv[3]).read()
    for name, msgs in CASES.items():
        print(f"small32 {name}: {cpp(render(small32, msgs))}")
    print(f"small32 later_system: {cpp(render(small32, LATER_SYSTEM))}")
print("small31 without a system message (not compared):",
      cpp(render(small31, [{"role": "user", "content": "Hello"}])))
