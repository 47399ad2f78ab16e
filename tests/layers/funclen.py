#!/usr/bin/env python3
"""tests/layers/funclen.py - no function of kvd's production code is longer
than 80 lines, counted from the first line of its signature to its closing
brace (comments and blank lines inside count: a function a reader must
scroll through is too long, whatever it holds).

Production code is every .c file under conf/, gpu/, net/, daemon/ and
ctl/, except generated tables (a file whose first lines say "do not edit").
kvd's style puts a function's opening and closing braces alone in column
0, which is what this reads; a file that breaks that style would hide its
functions, so a brace pair that is not a function definition at column 0
is not expected in production code. Prints every function over the limit
(file:line name length) and the five longest, and exits 1 when one is over.

    funclen.py [SRC_ROOT] [--limit N]   (default: $KVD_SRC, else ../.., 80)
"""
import os
import re
import sys

TOPS = ["conf", "gpu", "net", "daemon", "ctl"]
NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def functions(path):
    """(first line, name, length) of each function definition in path"""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    if any("do not edit" in l for l in lines[:3]):
        return
    start = None
    for i, line in enumerate(lines):
        if line == "{":
            # the signature: back to the first line of the declaration
            j = i - 1
            while j > 0 and lines[j - 1].strip() and not lines[j - 1].startswith(
                    ("}", "/*", " *", "#", "//")) and not lines[j - 1].rstrip().endswith(
                    (";", "*/")):
                j -= 1
            sig = " ".join(lines[j:i])
            m = NAME.search(sig.split("(")[0] + "(") if "(" in sig else None
            start = (j, m.group(1) if m else "?")
        elif line.startswith("}") and start is not None:
            j, name = start
            yield j + 1, name, i - j + 1
            start = None


def main(argv):
    limit = 80
    if "--limit" in argv:
        k = argv.index("--limit")
        limit = int(argv[k + 1])
        del argv[k:k + 2]
    here = os.path.dirname(os.path.abspath(__file__))
    root = argv[0] if argv else os.environ.get("KVD_SRC", os.path.join(here, "..", ".."))
    found = []
    for top in TOPS:
        for dirpath, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".c"):
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, root)
                    found += [(n, rel, line, fn) for line, fn, n in functions(path)]
    found.sort(reverse=True)
    over = [f for f in found if f[0] > limit]
    for n, rel, line, fn in over:
        print("%s:%d: %s is %d lines (limit %d)" % (rel, line, fn, n, limit))
    print("longest: " + ", ".join("%s %d" % (fn, n) for n, _, _, fn in found[:5]))
    print("funclen: %d functions, %d over %d lines" % (len(found), len(over), limit))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
