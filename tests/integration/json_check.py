#!/usr/bin/env python3
"""json_check.py - judge response_format answers (tests/integration/http_json.sh).

    json_check.py SCHEMA ANSWER...
    json_check.py --selftest


SCHEMA is a file holding a JSON Schema, or "object" for json_object.
Each ANSWER is a file holding one answer as {"text": ..., "finish": ...}.
An answer that finished with "stop" must parse (json.loads) and match the
schema (a small validator for the subset kvd serves, written here apart
from kvd's own: Python's re for pattern, the standard library's parsers
for format); one cut by "length" must be a prefix of some JSON text
(a recursive-descent reader that tells "ran out" from "wrong"). Prints one
line per answer and a summary "stop=N length=M bad=K"; exits 1 when any
answer is bad. --selftest: the validator refuses a wrong value for each
keyword (so a check that passes has been able to fail).
"""
import datetime
import ipaddress
import json
import re
import sys
import uuid


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


def fmt_ok(f, v):
    """v (a string) is of format f"""
    try:
        if f == "date":
            return bool(re.fullmatch(r"\d{4}-\d\d-\d\d", v)) and bool(datetime.date.fromisoformat(v))
        if f == "time":
            m = re.fullmatch(r"(\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", v)
            return bool(m) and bool(datetime.time(int(m[1]), int(m[2]), int(m[3])))
        if f == "date-time":
            d, t = v.split("T")
            return fmt_ok("date", d) and fmt_ok("time", t)
        if f == "uuid":
            return len(v) == 36 and str(uuid.UUID(v)) == v.lower()
        if f == "email":
            return bool(re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-zA-Z]{2,}", v))
        if f == "ipv4":
            return bool(ipaddress.IPv4Address(v))
    except ValueError:
        return False
    raise ValueError("format %s unknown to json_check" % f)


def number_checks(v, s, path):
    out = []
    if "minimum" in s and v < s["minimum"]:
        out.append("%s: %r below minimum" % (path, v))
    if "maximum" in s and v > s["maximum"]:
        out.append("%s: %r above maximum" % (path, v))
    if "exclusiveMinimum" in s and v <= s["exclusiveMinimum"]:
        out.append("%s: %r not above exclusiveMinimum" % (path, v))
    if "exclusiveMaximum" in s and v >= s["exclusiveMaximum"]:
        out.append("%s: %r not below exclusiveMaximum" % (path, v))
    return out


def string_checks(v, s, path):
    out = []
    if len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", len(v)):
        out.append("%s: %d characters" % (path, len(v)))
    if "pattern" in s and not re.search(s["pattern"], v):
        out.append("%s: %r does not match the pattern" % (path, v))
    if "format" in s and not fmt_ok(s["format"], v):
        out.append("%s: %r is not a %s" % (path, v, s["format"]))
    return out


def validate(v, s, root, path="$"):
    """the reasons v does not match schema s (empty: it does)"""
    if s is True or s == {}:
        return []
    if "$ref" in s:
        _, where, name = s["$ref"].split("/")
        return validate(v, root[where][name], root, path)
    if "anyOf" in s or "oneOf" in s:
        branches = s.get("anyOf", s.get("oneOf"))
        ok = sum(1 for b in branches if not validate(v, b, root, path))
        if ok == 0 or ("oneOf" in s and ok > 1):
            return ["%s: %r matches %d of the branches" % (path, v, ok)]
        return []
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
    if TYPES["number"](v):
        out += number_checks(v, s, path)
    if isinstance(v, str):
        out += string_checks(v, s, path)
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


SELFTEST = [  # (schema, a value that must be refused, one that must pass)
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "x", None),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 3, 2.5),
    ({"type": "string", "minLength": 2}, "\u00e9", "ab"),
    ({"type": "string", "maxLength": 2}, "abc", "\U0001f600\u00e9"),
    ({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"}, "AB-12", "AB-123"),
    ({"type": "string", "pattern": "b"}, "aaa", "abc"),
    ({"type": "string", "format": "date"}, "2023-02-29", "2024-02-29"),
    ({"type": "string", "format": "date-time"}, "2024-01-01T24:00:00Z", "2024-01-01T23:00:00.5+01:00"),
    ({"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-42661417400", "123e4567-e89b-12d3-a456-426614174000"),
    ({"type": "string", "format": "email"}, "a.b", "a@b.io"),
    ({"type": "string", "format": "ipv4"}, "256.1.1.1", "255.1.1.1"),
    ({"type": "integer", "minimum": 3}, 2, 3),
    ({"type": "integer", "maximum": 3}, 4, 3),
    ({"type": "number", "exclusiveMinimum": 0}, 0, 0.5),
    ({"type": "number", "exclusiveMaximum": 1}, 1.0, 0.99),
]


def selftest():
    bad = 0
    for schema, wrong, right in SELFTEST:
        if not validate(wrong, schema, schema):
            print("BAD: %r passes %s" % (wrong, json.dumps(schema)))
            bad += 1
        if validate(right, schema, schema):
            print("BAD: %r fails %s" % (right, json.dumps(schema)))
            bad += 1
    print("selftest: %d cases, bad=%d" % (len(SELFTEST), bad))
    return 1 if bad else 0


def main():
    if sys.argv[1] == "--selftest":
        return selftest()
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
