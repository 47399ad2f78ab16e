#!/usr/bin/env python3
"""loadgen.py - closed-loop serving load against kvd or llama-server, timed
at the client, the same way for both.

    loadgen.py kvd HOST:PORT CLIENTS REQUESTS PROMPT_TOKENS MAX_TOKENS [SEED]
    loadgen.py llama HOST:PORT CLIENTS REQUESTS PROMPT_TOKENS MAX_TOKENS [SEED]

CLIENTS threads each send one request, read its whole stream, then send the
next, until REQUESTS were sent in all. Request i's prompt is PROMPT_TOKENS
token ids derived from i (distinct prompts: no prefix cache can help), greedy,
MAX_TOKENS to generate. kvd: the msgpack client protocol (net/PROTOCOL.md s. 1,
`tokens`); llama-server: POST /completion with stream=true, the prompt as
token ids, and the byte tokens 3..258 banned with logit_bias (the streaming
bug in ../shared/tools/llama.cpp/README.md). Each request records, on this
process's monotonic clock: send, every token's arrival, end.

Prints one JSON line: wall_s, requests, errors, tokens, tok_per_s, and
ttft_ms / itl_ms percentiles (p50, p90, p99, max) over the requests
(ttft: send to first token) and over every gap between consecutive tokens
of a request (itl). Standard library only.
"""
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "integration"))
import mpk  # noqa: E402


def prompt_ids(i, n, seed):
    # ids 300.. keep clear of specials and the byte tokens
    return [1] + [300 + (i * 7919 + j * 104729 + seed) % 15000 for j in range(n - 1)]


def run_kvd(addr, ids, max_tokens, rid):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    t0 = time.monotonic()
    mpk.send_frame(s, {"type": "request", "id": rid, "tokens": ids,
                       "max_tokens": max_tokens})
    err = None
    try:
        while True:
            m = mpk.recv_frame(s)
            kind = m.get("type")
            if kind == "token":
                times.append(time.monotonic())
            elif kind == "final":
                break
            else:
                err = "%s %s" % (m.get("code"), m.get("message"))
                break
    finally:
        s.close()
    return t0, times, err


def run_llama(addr, ids, max_tokens, rid):
    host, port = addr.rsplit(":", 1)
    body = json.dumps({
        "prompt": ids, "n_predict": max_tokens, "stream": True,
        "temperature": 0, "cache_prompt": False, "seed": rid,
        "logit_bias": [[t, False] for t in range(3, 259)],
    }).encode()
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.monotonic()
    s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    times, err, buf = [], None, b""
    f = s.makefile("rb")
    try:
        status = f.readline()
        if b" 200 " not in status:
            return t0, times, status.decode(errors="replace").strip()
        while f.readline() not in (b"\r\n", b""):
            pass
        for line in f:
            # chunked transfer: size lines and data lines interleave;
            # only "data: {...}" lines matter
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            o = json.loads(line[6:])
            if "error" in o:
                err = str(o["error"])
                break
            if o.get("content") is not None and not o.get("stop"):
                times.append(time.monotonic())
            elif o.get("stop"):
                if o.get("content"):
                    times.append(time.monotonic())
                break
    finally:
        f.close()
        s.close()
    return t0, times, err


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))]


def main():
    kind, addr = sys.argv[1], sys.argv[2]
    clients, requests, n_prompt, max_tokens = map(int, sys.argv[3:7])
    seed = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    fn = run_kvd if kind == "kvd" else run_llama
    lock = threading.Lock()
    state = {"next": 0}
    results = []

    def worker():
        while True:
            with lock:
                i = state["next"]
                if i >= requests:
                    return
                state["next"] = i + 1
            try:
                r = fn(addr, prompt_ids(i, n_prompt, seed), max_tokens, i + 1)
            except Exception as e:  # a dead connection is an error, not a crash
                r = (time.monotonic(), [], repr(e))
            with lock:
                results.append(r)

    t0 = time.monotonic()
    th = [threading.Thread(target=worker) for _ in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.monotonic() - t0
    ttft, itl, itl1, itl_rest, toks, errors = [], [], [], [], 0, []
    for start, times, err in results:
        if err:
            errors.append(err)
        toks += len(times)
        if times:
            ttft.append((times[0] - start) * 1e3)
            gaps = [(b - a) * 1e3 for a, b in zip(times, times[1:])]
            itl += gaps
            itl1 += gaps[:1]
            itl_rest += gaps[1:]
    out = {"kind": kind, "clients": clients, "wall_s": round(wall, 3),
           "requests": len(results), "errors": len(errors), "tokens": toks,
           "tok_per_s": round(toks / wall, 2) if wall else None}
    for name, v in (("ttft_ms", ttft), ("itl_ms", itl), ("itl_first_ms", itl1),
                    ("itl_rest_ms", itl_rest)):
        out[name] = {k: (round(pct(v, p), 2) if v else None)
                     for k, p in (("p50", .5), ("p90", .9), ("p99", .99), ("max", 1.0))}
    if errors:
        out["first_error"] = errors[0][:200]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
