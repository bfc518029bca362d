#!/usr/bin/env python3
"""Renders every template in templates/ with Jinja itself, configured as transformers'
apply_chat_template configures it (differential.environment()), over the conversations below, and writes what Jinja renders (or the error it
raises) to references.json. tests/api/jinja_test.cpp renders the same with Colony's Jinja and
compares. Needs python3-jinja2 (Debian); run it again after changing a template or a case:

    python3 tests/data/jinja/make_references.py
"""
import json
import os

import jinja2

from differential import environment  # Jinja as transformers configures it

HERE = os.path.dirname(os.path.abspath(__file__))


TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}

CONVERSATIONS = {
    "one-user": [{"role": "user", "content": "Hello!"}],
    "system-and-turns": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?  "},
    ],
    "unicode-and-spaces": [
        {"role": "user", "content": "  Ünïcödé ✓ — 日本語 straße ŉ ĳ Ωμέγας Привет ÿ µ \"quotes\" 'single'\n\nnew\tlines  "},
        {"role": "assistant", "content": "ÀÉÎÕÜ ŸŽ ΆΈΉΊΌΎΏ ЁЂЃ ѢѣҊҋ İ ı"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "<think>hidden</think>  padded answer  "},
        {"role": "user", "content": "{{ not a template }} {% neither %}"},
    ],
    "out-of-order": [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "second"},
    ],
    "empty": [],
}

# As a client sends them (tests/api/request_test.cpp sends the same through colony's request
# parser), keys in an order that is not sorted.
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string"},
                                      "unit": {"type": "string", "enum": ["celsius", "kelvin"]}},
                       "required": ["city"]},
    },
}]

TOOL_TURNS = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather",
                                  "arguments": {"city": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "content": "{\"temperature\": 21.5}", "tool_call_id": "call_1"},
    {"role": "user", "content": "Thanks"},
]


def cases():
    for name in sorted(os.listdir(os.path.join(HERE, "templates"))):
        template = name[:-len(".jinja")]
        for conversation, messages in CONVERSATIONS.items():
            for prompt in (True, False):
                if not prompt and conversation != "system-and-turns":
                    continue
                yield template, dict(TOKENS, messages=messages, add_generation_prompt=prompt,
                                     tools=None, documents=None)
        if template in ("qwen2.5", "llama3.1"):
            yield template, dict(TOKENS, messages=TOOL_TURNS, add_generation_prompt=True,
                                 tools=TOOLS, documents=None)


def main():
    env = environment()
    out = []
    for template, context in cases():
        with open(os.path.join(HERE, "templates", template + ".jinja"), encoding="utf-8") as f:
            source = f.read()
        case = {"template": template, "context": context}
        try:
            case["output"] = env.from_string(source).render(**context)
        except jinja2.exceptions.TemplateError as e:
            case["error"] = str(e)
            # raise_exception's own message (Colony passes it on as it is), or Jinja's.
            case["raised"] = type(e) is jinja2.exceptions.TemplateError
        out.append(case)
    with open(os.path.join(HERE, "references.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2": jinja2.__version__, "cases": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(out)} cases, {sum('error' in c for c in out)} of them errors")


if __name__ == "__main__":
    main()
