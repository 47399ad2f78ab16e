#!/usr/bin/env python3
"""tests/integration/stall_probe.py - does one tenant's flood of large
chat bodies stall another tenant? For http_tenants.sh.

    stall_probe.py PORT VICTIM_KEY FLOOD_KEY CONNS PER_CONN BODY_BYTES [MSGPACK_PORT]

The victim streams a long completion (temperature 0, 8000 tokens) and
/health is probed every 10 ms; once the stream runs, CONNS connections
each send PER_CONN chat requests of BODY_BYTES of JSON (one user message
of ordinary words) with FLOOD_KEY, one after the other, reading each
answer. With MSGPACK_PORT the flood goes to the msgpack client API
instead: each connection authenticates with FLOOD_KEY and sends PER_CONN
completion requests whose text prompt is BODY_BYTES of ordinary words
(a status is "final" or the error's code). Measured at the client,
during the flood only: the longest gap
between two SSE events of the victim, and the longest /health round
trip. Prints one JSON line:

    {"flood_s", "gap_max_ms", "gap_p99_ms", "events", "health_max_ms",
     "health_n", "flood_status": {status: count}, "baseline_gap_max_ms"}

baseline_gap_max_ms is the longest gap in the second before the flood
(the machine's own noise). Exits 0 unless a socket failed.
"""
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpk  # noqa: E402

PORT = int(sys.argv[1])
VICTIM, FLOOD = sys.argv[2], sys.argv[3]
CONNS, PER_CONN, BODY = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
MSGPACK_PORT = int(sys.argv[7]) if len(sys.argv) > 7 else 0


def request(path, key, body=None):
    method = "POST" if body is not None else "GET"
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n"
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + (body or b"")


def read_answer(f):
    """Status of one answer with Content-Length (kvd's JSON answers)."""
    status = int(f.readline().split()[1])
    length = 0
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    f.read(length)
    return status


events = []          # arrival times of the victim's SSE events
health = []          # (start, round trip)
stop = threading.Event()


def victim():
    s = socket.create_connection(("127.0.0.1", PORT))
    body = json.dumps({"prompt": "Once upon", "max_tokens": 8000,
                       "temperature": 0, "stream": True}).encode()
    s.sendall(request("/v1/completions", VICTIM, body))
    f = s.makefile("rb")
    while not stop.is_set():
        line = f.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events.append(time.monotonic())
            if line.startswith(b"data: [DONE]"):
                break
    s.close()


def prober():
    s = socket.create_connection(("127.0.0.1", PORT))
    f = s.makefile("rb")
    while not stop.is_set():
        t0 = time.monotonic()
        s.sendall(request("/health", None))
        read_answer(f)
        health.append((t0, time.monotonic() - t0))
        time.sleep(0.01)
    s.close()


def flood_body():
    words = b"the little dog saw a big tree and went to play with friends "
    content = (words * (BODY // len(words) + 1))[:BODY - 200].decode()
    return json.dumps({"messages": [{"role": "user", "content": content}],
                       "max_tokens": 1}).encode()


flood_status = {}
flood_lock = threading.Lock()


def flooder(body):
    s = socket.create_connection(("127.0.0.1", PORT))
    f = s.makefile("rb")
    for _ in range(PER_CONN):
        s.sendall(request("/v1/chat/completions", FLOOD, body))
        st = read_answer(f)
        with flood_lock:
            flood_status[st] = flood_status.get(st, 0) + 1
    s.close()


def mp_flooder(_body):
    words = "the little dog saw a big tree and went to play with friends "
    text = (words * (BODY // len(words) + 1))[:BODY]
    s = socket.create_connection(("127.0.0.1", MSGPACK_PORT), timeout=60)
    mpk.send_frame(s, {"type": "auth", "key": FLOOD})
    if mpk.recv_frame(s).get("type") != "auth_ok":
        raise SystemExit("stall_probe: msgpack auth refused")
    for i in range(PER_CONN):
        mpk.send_frame(s, {"type": "request", "id": i + 1, "prompt": text,
                           "max_tokens": 1})
        while True:
            m = mpk.recv_frame(s)
            if m.get("type") in ("final", "error", "frame_error"):
                st = "final" if m["type"] == "final" else m.get("code", m["type"])
                break
        with flood_lock:
            flood_status[st] = flood_status.get(st, 0) + 1
    s.close()


def gaps(t_from, t_to):
    ev = [t for t in events if t_from <= t <= t_to]
    return sorted(b - a for a, b in zip(ev, ev[1:])), len(ev)


def main():
    body = flood_body()
    # the victim must outlast the flood: on a quiet machine 8000 tokens
    # take 5-8 s, the flood about one
    tv = threading.Thread(target=victim, daemon=True)
    tp = threading.Thread(target=prober, daemon=True)
    tv.start()
    while len(events) < 5:
        time.sleep(0.005)
    tp.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    fl = [threading.Thread(target=mp_flooder if MSGPACK_PORT else flooder, args=(body,))
          for _ in range(CONNS)]
    for t in fl:
        t.start()
    for t in fl:
        t.join()
    t1 = time.monotonic()
    stop.set()
    g, n = gaps(t0, t1)
    base, _ = gaps(t0 - 1.0, t0)
    h = [rt for (ts, rt) in health if t0 <= ts <= t1]
    print(json.dumps({
        "flood_s": round(t1 - t0, 3),
        "gap_max_ms": round(1000 * g[-1], 1) if g else None,
        "gap_p99_ms": round(1000 * g[int(0.99 * (len(g) - 1))], 1) if g else None,
        "events": n,
        "health_max_ms": round(1000 * max(h), 1) if h else None,
        "health_n": len(h),
        "flood_status": flood_status,
        "baseline_gap_max_ms": round(1000 * base[-1], 1) if base else None,
    }))


main()
