#!/usr/bin/env python3
"""tests/layers/includes.py - every #include "folder/..." of the project's
C sources points down the layers, never up:

    conf  <-  gpu  <-  net  <-  daemon  <-  ctl

A file may include its own folder and the folders below it. The one
exception is the entry point daemon/main.c, which starts ctl/'s admin
server. Prints every forbidden include (file:line) and exits 1 when
there is one.

    includes.py [SRC_ROOT]      (default: $KVD_SRC, else this file's ../..)
"""
import os
import re
import sys

LAYERS = ["conf", "gpu", "net", "daemon", "ctl"]
# file (relative to the root) -> folders it may include beyond the rule
EXCEPTIONS = {"daemon/main.c": {"ctl"}}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def check(root):
    bad = []
    for i, layer in enumerate(LAYERS):
        allowed = set(LAYERS[: i + 1])
        folder = os.path.join(root, layer)
        for dirpath, _, files in os.walk(folder):
            for name in sorted(files):
                if not name.endswith((".c", ".h", ".cu")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                extra = EXCEPTIONS.get(rel, set())
                with open(path, encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1) in LAYERS and \
                           m.group(1) not in allowed | extra:
                            bad.append("%s:%d: %s/ includes %s/ (a layer above it)"
                                       % (rel, n, layer, m.group(1)))
    return bad


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = sys.argv[1] if len(sys.argv) > 1 else \
        os.environ.get("KVD_SRC", os.path.join(here, "..", ".."))
    bad = check(root)
    for b in bad:
        print(b)
    n = sum(1 for layer in LAYERS for _, _, fs in os.walk(os.path.join(root, layer))
            for f in fs if f.endswith((".c", ".h", ".cu")))
    print("includes: %d files, %d forbidden" % (n, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
