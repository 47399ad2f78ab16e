#!/usr/bin/env python3
"""tests/layers/check.py - no file in daemon/ calls back into a file that
calls it (issue 9): the call graph between daemon/'s source files, read
from their object files with nm, must have no cycle.

    check.py OBJ...      (each OBJ named after its source: x.c.o)
    check.py             (the objects of daemon/ in $KVD_BUILD)

A call through a function pointer is not an edge: that is how a lower
file reaches what a role sets (struct serve_req_ops, serve->admit). An
edge is a global symbol one object defines and another uses. Prints the
layers it found (each file after every file it calls) or every cycle,
and exits 1 on a cycle.
"""
import glob
import os
import subprocess
import sys


def symbols(obj):
    out = subprocess.run(["nm", "--defined-only", "-g", obj], capture_output=True,
                         text=True, check=True).stdout
    defined = {l.split()[-1] for l in out.splitlines() if len(l.split()) >= 3}
    out = subprocess.run(["nm", "-u", obj], capture_output=True, text=True,
                         check=True).stdout
    used = {l.split()[-1] for l in out.splitlines() if l.strip()}
    return defined, used


def main(objs):
    if not objs and os.environ.get("KVD_BUILD"):
        b = os.environ["KVD_BUILD"]
        objs = sorted(glob.glob(os.path.join(b, "daemon", "libkvd_daemon.a.p", "*.o")) +
                      glob.glob(os.path.join(b, "kvd.p", "daemon_*.o")))
    if not objs:
        print("usage: check.py OBJ... (or KVD_BUILD set)", file=sys.stderr)
        return 2
    name = {o: os.path.basename(o).replace(".c.o", ".c").split("_", 1)[-1]
            if os.path.basename(o).startswith("daemon_") else
            os.path.basename(o).replace(".c.o", ".c") for o in objs}
    owner, uses = {}, {}
    for o in objs:
        d, u = symbols(o)
        for s in d:
            owner[s] = name[o]
        uses[name[o]] = u
    calls = {f: sorted({owner[s] for s in u if s in owner and owner[s] != f})
             for f, u in uses.items()}
    # cycles: depth-first search for back edges
    cycles, state, stack = [], {}, []

    def dfs(f):
        state[f] = 1
        stack.append(f)
        for g in calls[f]:
            if state.get(g) == 1:
                cycles.append(stack[stack.index(g):] + [g])
            elif g not in state:
                dfs(g)
        stack.pop()
        state[f] = 2

    for f in sorted(calls):
        if f not in state:
            dfs(f)
    if cycles:
        for c in cycles:
            print("cycle: " + " -> ".join(c))
        return 1
    # layers: a file's layer is one more than the highest layer it calls
    layer = {}

    def depth(f):
        if f not in layer:
            layer[f] = 1 + max((depth(g) for g in calls[f]), default=-1)
        return layer[f]

    for f in calls:
        depth(f)
    for n in range(max(layer.values()) + 1):
        row = sorted(f for f in layer if layer[f] == n)
        print(f"layer {n}: " + " ".join(row))
    print(f"ok - {len(calls)} files, no file calls back into a file that calls it")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
