#!/usr/bin/env python3
"""Random templates rendered by Jinja itself, for tests/api/jinja_test.cpp to render with
Colony's Jinja and compare: `differential.py MODE SEED COUNT` prints COUNT JSON lines
{"template", "output"} or {"template", "error"}, then one line {"context": ...} with what both
render against. MODE "expressions": one {{ }} of random nested literals, operators, filters,
tests, methods, subscripts and slices; "statements": random text, whitespace control, comments,
if/elif/else, for (with loop, filters, else), set, namespaces and macros.

Jinja is configured as transformers' apply_chat_template configures it (trim_blocks,
lstrip_blocks, loop controls, its tojson). Generators (what select, map, unique, reverse and
items give) appear only consumed (|list, |join), and dict views only as lists: printed, Jinja
shows their Python object address. Needs python3-jinja2 (scripts/setup installs it)."""
import copy
import json
import random
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def environment():
    """Jinja as transformers' apply_chat_template configures it
    (transformers/utils/chat_template_utils.py): an immutable sandbox with trim_blocks and
    lstrip_blocks, loop controls, and its own tojson and raise_exception."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


CONTEXT = {
    "s": "  Hello, Wörld! ", "t": "a-b_c d", "n": 7, "m": -3, "f": 2.5, "z": 0,
    "l": [3, 1, 2, 1], "w": ["x", "Y", "z"], "d": {"b": 1, "a": "two", "c": [1, 2]}, "e": "",
    "none_": None,
    "messages": [{"role": "system", "content": " sys "}, {"role": "user", "content": "Hi?"},
                 {"role": "assistant", "content": "ok"}],
}
STRINGS = ["'a'", "'Ab c'", "\"it's\"", "'x\\ny'", "'é'", "''", "' pad '", "'1'", "'2.5'",
           "'a,b'", "'ΣΑΣ ß'", "'%s!'", "'%d%%'", "'%-4s|%.2f'", "'%(a)s'", "'\\nx\\r\\ny\\n'"]
FILTERS = [
    "trim", "upper", "lower", "length", "count", "first", "last", "list", "sort", "string",
    "int", "float", "tojson", "title", "capitalize", "abs", "round", "indent", "join",
    "default('D')", "default('D', true)", "join(', ')", "replace('a', 'X')", "sum", "min", "max",
    "tojson(indent=2)", "trim('H')", "int(9)", "sort(reverse=true)", "dictsort", "d",
    "first|string", "round(1)", "indent(2, true)", "indent(1, true, true)", "sort(attribute='role')|map(attribute='role')|list",
    "map(attribute='role')|list", "selectattr('role', 'eq', 'user')|list",
    "rejectattr('role')|list", "select('odd')|list", "reject('none')|list", "unique|list",
    "reverse|list", "items|list", "map('string')|list", "map('upper')|join('/')",
    "selectattr('content')|map(attribute='content')|join", "unique(true)|list",
    "tojson(sort_keys=true)", "max(attribute='role')", "min(true)", "sum(start=1)",
]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
         "iterable", "sequence", "odd", "even", "divisibleby(3)", "in([1, 2, 3])", "eq(7)",
         "lower", "upper", "boolean", "true", "false", "sameas(none)", "ne('a')", "gt(1)",
         "le 2", "callable"]
METHODS = ["strip()", "lstrip()", "rstrip()", "split()", "split(',')", "split(' ', 1)",
           "split(none, 1)", "split(maxsplit=0)",
           "startswith('H')", "endswith(('!', ' '))", "upper()", "lower()", "title()",
           "capitalize()", "replace('l', 'L')", "find('o')", "count('l')", "items()|list",
           "keys()|list", "values()|list", "get('a')", "get('q', 5)", "strip('H ')",
           "join(['p', 'q'])", "count(1)", "index(1)"]
OPERATORS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">", "<=", ">=", "in",
             "not in", "and", "or"]


def expressions(r, count):
    def literal(depth):
        c = r.randrange(8)
        if c == 0:
            return str(r.randrange(-5, 20))
        if c == 1:
            return r.choice(["0.5", "1.0", "2.25", "1e3", "-0.1", "3.0"])
        if c == 2:
            return r.choice(STRINGS)
        if c == 3:
            return r.choice(["none", "true", "false", "True", "None"])
        if c == 4:
            return "[" + ", ".join(expr(depth + 1) for _ in range(r.randrange(4))) + "]"
        if c == 5:
            items = (f"{r.choice(STRINGS)}: {expr(depth + 1)}" for _ in range(r.randrange(3)))
            return "{" + ", ".join(items) + "}"
        if c == 6:
            return "(" + expr(depth + 1) + ", " + expr(depth + 1) + ")"
        return r.choice(list(CONTEXT) + ["undefined_x"])

    def expr(depth=0):
        if depth > 3:
            return literal(depth)
        c = r.randrange(9)
        if c <= 1:
            return literal(depth)
        if c == 2:
            return f"({expr(depth + 1)} {r.choice(OPERATORS)} {expr(depth + 1)})"
        if c == 3:
            return f"({expr(depth + 1)}|{r.choice(FILTERS)})"
        if c == 4:
            return f"({expr(depth + 1)} is {r.choice(['', 'not '])}{r.choice(TESTS)})"
        if c == 5:
            return f"{r.choice(['s', 't', 'd', 'e', 'w', 'l'])}.{r.choice(METHODS)}"
        if c == 6:
            index = r.choice(["0", "-1", "1:", ":2", "::-1", "1:-1", "5", "-9:", "::2", "'role'"])
            return f"{r.choice(['s', 'l', 'w', 't', 'messages', 'd'])}[{index}]"
        if c == 7:
            return f"({expr(depth + 1)} if {expr(depth + 1)} else {expr(depth + 1)})"
        return f"(not {expr(depth + 1)})" if r.random() < 0.5 else f"(-{expr(depth + 1)})"

    for _ in range(count):
        yield "{{ " + expr() + " }}"


def statements(r, count):
    texts = ["", " ", "  ", "\n", "\n  ", "  \n", "a", " b ", "\t", "\n\n", "x\n  ", "  y",
             "\n\t z", " \n \n "]

    def text():
        return "".join(r.choice(texts) for _ in range(r.randrange(3)))

    def begin():
        return "{%" + r.choice(["", "-", "+"])

    def end():
        return r.choice(["", "-", "+"]) + "%}"

    def output():
        value = r.choice(["n", "loop.index", "m.role", "x", "ns.c", "'q'", "s|trim", "loop.first",
                          "i", "loop.revindex", "loop.last", "a ~ b", "k ~ '=' ~ v"])
        return "{{" + r.choice(["", "-"]) + " " + value + " " + r.choice(["", "-"]) + "}}"

    def comment():
        return "{#" + r.choice(["", "-"]) + " c " + r.choice(["", "-"]) + "#}"

    def block(depth, in_loop=False):
        out = ""
        for _ in range(r.randrange(1, 5)):
            c = r.randrange(11)
            if c < 3:
                out += text()
            elif c == 3:
                out += output()
            elif c == 4:
                out += comment()
            elif c == 5 and depth < 3:
                cond = r.choice(["n > 3", "loop is defined and loop.first", "x", "not m", "i"])
                out += f"{begin()} if {cond} {end()}{block(depth + 1, in_loop)}"
                if r.random() < 0.5:
                    out += f"{begin()} elif {r.choice(['true', 'n'])} {end()}"
                    out += block(depth + 1, in_loop)
                if r.random() < 0.5:
                    out += f"{begin()} else {end()}{block(depth + 1, in_loop)}"
                out += f"{begin()} endif {end()}"
            elif c == 6 and depth < 3:
                loop = r.choice(["m in messages", "i in range(3)", "i in l if i > 1",
                                 "k, v in d.items()", "i in w|reverse"])
                out += f"{begin()} for {loop} {end()}{block(depth + 1, True)}"
                if r.random() < 0.2:
                    out += f"{begin()} {r.choice(['break', 'continue'])} {end()}"
                if r.random() < 0.3:
                    out += f"{begin()} else {end()}{block(depth + 1, in_loop)}"
                out += f"{begin()} endfor {end()}"
            elif c == 7:
                out += f"{begin()} set x = {r.choice(['1', 'n + 1', 'x ~ 2', '[1]'])} {end()}"
            elif c == 8:
                out += f"{begin()} set ns.c = {r.choice(['ns.c + 1', '0'])} {end()}"
            elif c == 9 and depth < 2:
                out += (f"{begin()} macro mm(a, b='B') {end()}{block(depth + 1)}"
                        f"{begin()} endmacro {end()}{{{{ mm(1) }}}}")
            elif c == 10:
                control = (f"{begin()} {r.choice(['break', 'continue'])} {end()}"
                           if in_loop and r.random() < 0.3 else "")
                out += (f"{begin()} set y {end()}{block(depth + 1, in_loop)}{control}"
                        f"{begin()} endset {end()}{{{{ y }}}}")
            out += text()
        return out

    for _ in range(count):
        yield (text() + "{% set ns = namespace(c=0) %}" + text() + block(0) + text() +
               r.choice(["", "\n"]))


def main():
    mode, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    env = environment()
    r = random.Random(seed)
    make = expressions if mode == "expressions" else statements
    for source in make(r, count):
        case = {"template": source}
        try:
            # A copy each time: Jinja's indent filter extends a list given to it in place.
            case["output"] = env.from_string(source).render(**copy.deepcopy(CONTEXT))
        except Exception as e:  # anything Jinja raises: Colony must fail too
            case["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(case, ensure_ascii=False))
    print(json.dumps({"context": CONTEXT}, ensure_ascii=False))


if __name__ == "__main__":
    main()
