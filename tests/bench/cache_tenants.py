#!/usr/bin/env python3
"""cache_tenants.py - one run of issue 21.6's prefix-cache load against kvd's
HTTP front or llama-server, timed at the client the same way for both.

    cache_tenants.py kvd|llama HOST:PORT CLIENTS REQUESTS SYS_TOKENS MAX_TOKENS SEED KEYS

TENANTS = 4: tenant t has its own SYS_TOKENS-token system prompt (token ids
from SEED and t). CLIENTS closed-loop threads, client c of tenant c % 4,
each request its tenant's system prompt then a short distinct user turn
(8 ids), streamed, greedy, MAX_TOKENS to generate, until REQUESTS were sent.
kvd: POST /v1/completions with the tenant's key (KEYS: comma list, the 4
tenants' then the prober's); llama-server: POST /completion with
cache_prompt true (its prompt cache; it has no tenants).

Then the cross-tenant probe: 5 times, sequentially on the idle server, the
victim (tenant 0) sends a fresh SYS_TOKENS prefix, then the prober (kvd: a
fifth tenant; llama: any client) sends a right guess (that prefix + a
fresh turn) and a wrong guess (a fresh random prefix of the same length +
a fresh turn), max_tokens 1; the ratio
is median(right) / median(wrong): 1.0 means the guess is unmeasurable.

Prints one JSON line: wall_s, requests, errors, tokens, tok_per_s,
ttft_ms {p50, p99}, probe {right_ms, wrong_ms, ratio}. Standard library only.
"""
import json
import random
import socket
import statistics
import sys
import threading
import time

TENANTS = 4


def sse(addr, path, body, key, kind):
    """POST body, read the SSE stream: (t0, [token arrival times], err)."""
    host, port = addr.rsplit(":", 1)
    data = json.dumps(body).encode()
    auth = b"Authorization: Bearer %s\r\n" % key.encode() if key else b""
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.monotonic()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"%sConnection: close\r\nContent-Length: %d\r\n\r\n"
              % (path.encode(), auth, len(data)) + data)
    times, err = [], None
    f = s.makefile("rb")
    try:
        status = f.readline()
        if b" 200 " not in status:
            return t0, times, status.decode(errors="replace").strip()
        while f.readline() not in (b"\r\n", b""):
            pass
        for line in f:
            line = line.strip()
            if line == b"data: [DONE]":
                break
            if not line.startswith(b"data: "):
                continue
            o = json.loads(line[6:])
            if "error" in o:
                err = str(o["error"])
                break
            if kind == "llama":
                if o.get("content"):
                    times.append(time.monotonic())
                if o.get("stop"):
                    break
            elif o.get("choices") and o["choices"][0].get("text"):
                times.append(time.monotonic())
    finally:
        f.close()
        s.close()
    return t0, times, err


def request(kind, addr, ids, max_tokens, key):
    if kind == "llama":
        body = {"prompt": ids, "n_predict": max_tokens, "stream": True,
                "temperature": 0, "cache_prompt": True,
                "logit_bias": [[t, False] for t in range(3, 259)]}
        return sse(addr, "/completion", body, None, kind)
    body = {"prompt": ids, "max_tokens": max_tokens, "stream": True,
            "temperature": 0}
    return sse(addr, "/v1/completions", body, key, kind)


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else None


def main():
    kind, addr = sys.argv[1], sys.argv[2]
    clients, requests, n_sys, max_tokens, seed = map(int, sys.argv[3:8])
    keys = sys.argv[8].split(",") if len(sys.argv) > 8 else [""] * 5
    rng = random.Random(seed)
    # ids 300.. keep clear of specials and byte tokens
    system = [[300 + rng.randrange(15000) for _ in range(n_sys)]
              for _ in range(TENANTS)]
    lock = threading.Lock()
    state = {"next": 0}
    res = []

    def client(c):
        t = c % TENANTS
        while True:
            with lock:
                i = state["next"]
                if i >= requests:
                    return
                state["next"] += 1
            turn = [300 + (i * 7919 + j * 104729 + seed) % 15000 for j in range(8)]
            t0, times, err = request(kind, addr, system[t] + turn, max_tokens,
                                     keys[t])
            with lock:
                res.append((t0, times, err))

    w0 = time.monotonic()
    th = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for x in th:
        x.start()
    for x in th:
        x.join()
    wall = time.monotonic() - w0
    ok = [r for r in res if not r[2] and r[1]]
    ttft = [(r[1][0] - r[0]) * 1000 for r in ok]
    tokens = sum(len(r[1]) for r in ok)
    right, wrong = [], []
    prober = keys[4] if len(keys) > 4 else ""
    fresh = lambda n: [300 + rng.randrange(15000) for _ in range(n)]
    for p in range(5):
        # a prefix the victim (tenant 0) just sent and the prober never
        # did: a prober's second guess of one prefix would hit its own
        victim = fresh(n_sys)
        request(kind, addr, victim + fresh(8), 1, keys[0])
        for ids, out in ((victim + fresh(8), right), (fresh(n_sys) + fresh(8), wrong)):
            t0, times, err = request(kind, addr, ids, 1, prober)
            if not err and times:
                out.append((times[-1] - t0) * 1000)
    probe = {"right_ms": statistics.median(right) if right else None,
             "wrong_ms": statistics.median(wrong) if wrong else None}
    probe["ratio"] = (probe["right_ms"] / probe["wrong_ms"]
                      if right and wrong else None)
    print(json.dumps({"wall_s": wall, "requests": len(res),
                      "errors": len(res) - len(ok), "tokens": tokens,
                      "tok_per_s": tokens / wall if wall else 0,
                      "req_per_s": len(ok) / wall if wall else 0,
                      "ttft_ms": {"p50": pct(ttft, 0.5), "p99": pct(ttft, 0.99)},
                      "probe": probe}))


if __name__ == "__main__":
    main()
