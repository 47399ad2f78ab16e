#!/usr/bin/env python3
"""bench_http.py - one load run against a decode node, through its msgpack
client socket or its HTTP front, measured on the client side alike:

    bench_http.py msgpack|http PORT CONC N SEED0 [KEY]

N requests (32 output tokens each, streamed: msgpack token events, or SSE
with stream=true) spread over CONC threads, each request on its own new
connection (so both protocols pay a connect). TTFT is the time from
sending the request to its first token event arriving; tok/s is output
tokens over the run's wall time. Prints one JSON line:
{"wall_s", "tokens", "ttft_us": [...], "errors"}.
"""
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import mpk  # noqa: E402

proto, port, conc, n, seed0 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
key = sys.argv[6] if len(sys.argv) > 6 else ""
PROMPT = "request {i}: once upon a time in a land far away there lived a small dragon who"
MAX_TOKENS = 32


def one_msgpack(i):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    if key:   # a keys file: the first frame authenticates (net/PROTOCOL.md)
        mpk.send_frame(s, {"type": "auth", "key": key})
        m = mpk.recv_frame(s)
        if not m or m.get("type") != "auth_ok":
            raise RuntimeError(str(m))
    mpk.send_frame(s, {"type": "request", "id": i, "prompt": PROMPT.format(i=i),
                       "max_tokens": MAX_TOKENS, "temperature": 0.8, "top_p": 1.0,
                       "top_k": 0, "seed": i})
    first, toks = None, 0
    while True:
        m = mpk.recv_frame(s)
        if m is None:
            raise RuntimeError("closed")
        if m["type"] == "token":
            if first is None:
                first = time.perf_counter()
        elif m["type"] == "final":
            toks = m["output_tokens"]
            break
        else:
            raise RuntimeError(str(m))
    s.close()
    return toks, (first - t0) * 1e6 if first else None


def one_http(i):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = json.dumps({"prompt": PROMPT.format(i=i), "max_tokens": MAX_TOKENS,
                       "temperature": 0.8, "seed": i, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n"
            + (f"Authorization: Bearer {key}\r\n" if key else "") + "\r\n").encode()
    t0 = time.perf_counter()
    s.sendall(head + body)
    buf, first, toks = b"", None, None
    while True:
        d = s.recv(65536)
        if not d:
            break
        if first is None and b"data: {" in buf + d:
            first = time.perf_counter()
        buf += d
    s.close()
    for line in buf.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage"' in line:
            toks = json.loads(line[6:].split(b"\r")[0])["usage"]["completion_tokens"]
    if toks is None:
        raise RuntimeError(buf[:200])
    return toks, (first - t0) * 1e6 if first else None


one = one_msgpack if proto == "msgpack" else one_http
lock = threading.Lock()
res = {"tokens": 0, "ttft_us": [], "errors": 0}
next_i = [0]


def worker():
    while True:
        with lock:
            if next_i[0] >= n:
                return
            i = seed0 + next_i[0]
            next_i[0] += 1
        try:
            toks, ttft = one(i)
            with lock:
                res["tokens"] += toks
                if ttft is not None:
                    res["ttft_us"].append(int(ttft))
        except Exception as e:  # noqa: BLE001
            with lock:
                res["errors"] += 1
            print("bench_http:", proto, e, file=sys.stderr)


t0 = time.perf_counter()
th = [threading.Thread(target=worker) for _ in range(conc)]
for t in th:
    t.start()
for t in th:
    t.join()
res["wall_s"] = time.perf_counter() - t0
print(json.dumps(res))
