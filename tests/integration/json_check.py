#!/usr/bin/env python3
"""json_check.py - judge response_format answers (tests/integration/http_json.sh).

    json_check.py SCHEMA ANSWER...

SCHEMA is a file holding a JSON Schema, or "object" for json_object.
Each ANSWER is a file holding one answer as {"text": ..., "finish": ...}.
An answer that finished with "stop" must parse (json.loads) and match the
schema (a small validator for the subset kvd serves, written here apart
from kvd's own); one cut by "length" must be a prefix of some JSON text
(a recursive-descent reader that tells "ran out" from "wrong"). Prints one
line per answer and a summary "stop=N length=M bad=K"; exits 1 when any
answer is bad.
"""
import json
import sys


class Short(Exception):
    """the text ended before the value did"""


class Wrong(Exception):
    """the text cannot be the start of a JSON text"""


class Prefix:
    WS = " \t\n\r"

    def __init__(self, s):
        self.s, self.i = s, 0

    def peek(self):
        if self.i >= len(self.s):
            raise Short()
        return self.s[self.i]

    def take(self, want=None):
        c = self.peek()
        if want is not None and c not in want:
            raise Wrong("%r at %d, want one of %r" % (c, self.i, want))
        self.i += 1
        return c

    def ws(self):
        while self.i < len(self.s) and self.s[self.i] in self.WS:
            self.i += 1

    def word(self, w):
        for ch in w:
            self.take(ch)

    def string(self):
        self.take('"')
        while True:
            c = self.take()
            if c == '"':
                return
            if c == "\\":
                e = self.take('"\\/bfnrtu')
                if e == "u":
                    for _ in range(4):
                        self.take("0123456789abcdefABCDEF")
            elif ord(c) < 0x20:
                raise Wrong("control character at %d" % (self.i - 1))

    def number(self):
        if self.peek() == "-":
            self.take()
        if self.take("0123456789") != "0":
            while self.i < len(self.s) and self.s[self.i].isdigit():
                self.i += 1
        if self.i < len(self.s) and self.s[self.i] == ".":
            self.take()
            self.take("0123456789")
            while self.i < len(self.s) and self.s[self.i].isdigit():
                self.i += 1
        if self.i < len(self.s) and self.s[self.i] in "eE":
            self.take()
            if self.peek() in "+-":
                self.take()
            self.take("0123456789")
            while self.i < len(self.s) and self.s[self.i].isdigit():
                self.i += 1

    def items(self, close, one):
        self.ws()
        if self.peek() == close:
            self.take()
            return
        while True:
            one()
            self.ws()
            if self.take("," + close) == close:
                return
            self.ws()

    def member(self):
        self.string()
        self.ws()
        self.take(":")
        self.ws()
        self.value()

    def value(self):
        c = self.peek()
        if c == "{":
            self.take()
            self.items("}", self.member)
        elif c == "[":
            self.take()
            self.items("]", self.value)
        elif c == '"':
            self.string()
        elif c in "-0123456789":
            self.number()
        elif c in "tfn":
            self.word({"t": "true", "f": "false", "n": "null"}[c])
        else:
            raise Wrong("%r at %d" % (c, self.i))


def is_prefix(s):
    p = Prefix(s)
    try:
        p.ws()
        p.value()
        p.ws()
    except Short:
        return True
    except Wrong:
        return False
    return p.i == len(s)   # complete, nothing after it


def same(a, b):
    return type(a) is type(b) and a == b or (
        isinstance(a, (int, float)) and not isinstance(a, bool) and
        isinstance(b, (int, float)) and not isinstance(b, bool) and a == b)


TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate(v, s, root, path="$"):
    """the reasons v does not match schema s (empty: it does)"""
    if s is True or s == {}:
        return []
    if "$ref" in s:
        _, where, name = s["$ref"].split("/")
        return validate(v, root[where][name], root, path)
    if "const" in s:
        return [] if same(v, s["const"]) else ["%s: not the const" % path]
    if "enum" in s:
        return [] if any(same(v, e) for e in s["enum"]) else ["%s: not in the enum" % path]
    t = s.get("type")
    if t is not None:
        names = t if isinstance(t, list) else [t]
        if not any(TYPES[n](v) for n in names):
            return ["%s: %r is not %s" % (path, v, t)]
    out = []
    if isinstance(v, dict):
        props = s.get("properties", {})
        for k in s.get("required", []):
            if k not in v:
                out.append("%s: %s missing" % (path, k))
        for k, x in v.items():
            if k in props:
                out += validate(x, props[k], root, path + "." + k)
            elif props or s.get("additionalProperties") is False:
                out.append("%s: %s is not a property" % (path, k))
    if isinstance(v, list):
        if len(v) < s.get("minItems", 0) or len(v) > s.get("maxItems", len(v)):
            out.append("%s: %d items" % (path, len(v)))
        for i, x in enumerate(v):
            out += validate(x, s.get("items", True), root, "%s[%d]" % (path, i))
    return out


def main():
    schema = {"type": "object"} if sys.argv[1] == "object" else json.load(open(sys.argv[1]))
    n = {"stop": 0, "length": 0, "bad": 0}
    for f in sys.argv[2:]:
        a = json.load(open(f))
        text, finish = a["text"], a["finish"]
        why = []
        if finish == "stop":
            try:
                why = validate(json.loads(text), schema, schema)
            except ValueError as e:
                why = ["does not parse: %s" % e]
        elif finish == "length":
            why = [] if is_prefix(text) else ["not a JSON prefix"]
        else:
            why = ["finish_reason %r" % finish]
        n["bad" if why else finish] += 1
        print("%s %s %s %s" % ("BAD" if why else "ok", finish, json.dumps(text)[:160],
                               "; ".join(why)))
    print("stop=%d length=%d bad=%d" % (n["stop"], n["length"], n["bad"]))
    return 1 if n["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
