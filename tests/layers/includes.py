#!/usr/bin/env python3
"""tests/layers/includes.py - every #include "folder/..." of the project's
C sources points down the layers, never up or sideways, down to the
sub-folders:

    conf                         utilities, config, logs (nothing below)
    gpu/gguf                     the GGUF file format
    gpu/cpu  gpu/kv  gpu/text    kernels | KV pages and pool | tokenizers
    gpu/model                    weights bound for the kernels, repack
    gpu/cuda                     the device-memory page store
    gpu                          the engine, sampler, the backends
    net/wire                     wire formats (msgpack, HTTP, OpenAI JSON)
    net                          transports, transfer checks, peer trust
    net/verbs                    the RDMA transport
    daemon/node                  links, requests, machines, compute, gate
    daemon/front                 the client fronts (msgpack, HTTP)
    daemon                       entry points (main, serve setup, generate)
    ctl                          the admin plane and kvctl

A file may include its own folder and the folders its folder may use
(RULES below, read transitively). The one exception is the entry point
daemon/main.c, which starts ctl/'s admin server. A folder that holds C
sources and is not in RULES fails too: a new folder is placed in the
layers when it is made. Prints every forbidden include (file:line) and
exits 1 when there is one.

    includes.py [SRC_ROOT]      (default: $KVD_SRC, else this file's ../..)
"""
import os
import re
import sys

# folder -> the folders it may include directly (each of those may bring
# in what it may use: the rule is transitive)
RULES = {
    "conf": [],
    "gpu/gguf": ["conf"],
    "gpu/cpu": ["gpu/gguf"],
    "gpu/kv": ["gpu/gguf"],
    "gpu/text": ["gpu/gguf"],
    "gpu/model": ["gpu/cpu"],
    "gpu/cuda": ["gpu/kv"],
    "gpu": ["gpu/model", "gpu/kv", "gpu/text", "gpu/cuda"],
    "net/wire": ["gpu"],
    "net": ["net/wire"],
    "net/verbs": ["net"],
    "daemon/node": ["net/verbs"],
    "daemon/front": ["daemon/node"],
    "daemon": ["daemon/front"],
    "ctl": ["daemon"],
}
# file (relative to the root) -> folders it may include beyond the rule
EXCEPTIONS = {"daemon/main.c": {"ctl"}}
TOPS = ["conf", "gpu", "net", "daemon", "ctl"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"((?:[a-z_]+/)+)[A-Za-z0-9_.]+"')


def allowed(folder):
    """folder and every folder reachable from it in RULES"""
    seen, todo = set(), [folder]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo.extend(RULES.get(f, []))
    return seen


def sources(root):
    for top in TOPS:
        for dirpath, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(files):
                if name.endswith((".c", ".h", ".cu")):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, root)


def check(root):
    bad = []
    for rel in sources(root):
        folder = os.path.dirname(rel)
        if folder not in RULES:
            bad.append("%s: folder %s/ is not in the layers (tests/layers/includes.py RULES)"
                       % (rel, folder))
            continue
        ok = allowed(folder) | EXCEPTIONS.get(rel, set())
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1).rstrip("/")
                if target.split("/")[0] not in TOPS:
                    continue
                if target not in ok:
                    bad.append("%s:%d: %s/ includes %s/ (not below it)"
                               % (rel, n, folder, target))
    return bad


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = sys.argv[1] if len(sys.argv) > 1 else \
        os.environ.get("KVD_SRC", os.path.join(here, "..", ".."))
    bad = check(root)
    for b in bad:
        print(b)
    n = sum(1 for _ in sources(root))
    folders = sorted({os.path.dirname(r) for r in sources(root)})
    print("includes: %d files in %d folders, %d forbidden" % (n, len(folders), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
