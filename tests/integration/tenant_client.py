#!/usr/bin/env python3
"""tests/integration/tenant_client.py - clients for tenants.sh: fair
admission, per-tenant queues, connection slots, the msgpack API's keys.
Each mode prints one line (JSON or key=value) the test reads.

    tenant_client.py PORT ttft KEY_A KEY_B FLOOD MAX_TOKENS ROUNDS
        B's time to first token alone, then while A keeps FLOOD streamed
        completions of MAX_TOKENS in flight (closed loop); A's own request
        time alone and during the flood. JSON: a_alone_ms,
        a_flood_p50_ms, b_alone_ms, b_flood_ms (list),
        b_flood_p50_ms, b_flood_max_ms, a_done, a_errors
    tenant_client.py PORT burst KEY N MAX_TOKENS
        N completions at once on N connections: "200=x 429=y retry_after=z
        other=w" (retry_after: 429s that carried Retry-After)
    tenant_client.py PORT silent N HOLD_S
        open N TCP connections that send nothing; hold them HOLD_S seconds
        (prints "opened=N" at once, flushing, then sleeps)
    tenant_client.py PORT busy KEY BODY_BYTES
        one completion whose body is BODY_BYTES long, sent whole (as an
        HTTP client does before it reads); prints the status it read
        ("status=503"), or "reset" when sending failed (the server closed
        with the request unread) / "closed"
    tenant_client.py PORT hold KEY S
        one streamed completion on a keep-alive connection, read for S
        seconds (holds a slot), then leaves
    tenant_client.py PORT mp_busy N
        msgpack: N requests of a 60 KB prompt written at once on a new
        connection, then the first frame read ("frame_error:OVERLOADED")
        or "reset" when sending failed
    tenant_client.py PORT mp_nokey
    tenant_client.py PORT mp_key KEY
        msgpack client API: a request without an auth frame, or after
        {type:auth, key}: prints the frames' types, e.g. "auth_ok token
        ... final" or "frame_error:INVALID_REQUEST"
"""
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpk  # noqa: E402

port = int(sys.argv[1])
mode = sys.argv[2]


def completion(key, max_tokens, stream=True, body_pad=0):
    b = {"prompt": "Once upon a time", "max_tokens": max_tokens,
         "stream": stream, "temperature": 0}
    if body_pad:
        b["user"] = "x" * body_pad
    body = json.dumps(b).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head + body


def read_head(f):
    status = f.readline().decode(errors="replace")
    headers = {}
    while True:
        line = f.readline().decode(errors="replace").strip()
        if not line:
            break
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    code = int(status.split()[1]) if status.startswith("HTTP/") else 0
    return code, headers


def stream_one(key, max_tokens):
    """(status, ttft_s, total_s): time to the first data event and to the end."""
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    s.sendall(completion(key, max_tokens))
    f = s.makefile("rb")
    code, _ = read_head(f)
    ttft = None
    if code == 200:
        for line in f:
            if line.startswith(b"data: ") and ttft is None and b"[DONE]" not in line:
                ttft = time.monotonic() - t0
            if line.startswith(b"data: [DONE]"):
                break
    s.close()
    return code, ttft, time.monotonic() - t0


def ttft():
    key_a, key_b = sys.argv[3], sys.argv[4]
    flood, max_tokens, rounds = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
    _, _, a_alone = stream_one(key_a, max_tokens)
    b_alone = min(stream_one(key_b, 2)[1] or 99 for _ in range(3))
    stop = threading.Event()
    done = [0, 0]
    a_times = []

    def a_loop():
        while not stop.is_set():
            code, _, total = stream_one(key_a, max_tokens)
            done[0 if code == 200 else 1] += 1
            a_times.append(total)

    threads = [threading.Thread(target=a_loop, daemon=True) for _ in range(flood)]
    for t in threads:
        t.start()
    time.sleep(max(0.5, a_alone))   # the flood is in flight and queued
    b = []
    for _ in range(rounds):
        code, t, _ = stream_one(key_b, 2)
        b.append(round((t or 99) * 1000, 1) if code == 200 else -code)
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    ok = sorted(x for x in b if x >= 0)
    a_times.sort()
    print(json.dumps({
        "a_flood_p50_ms": round(a_times[len(a_times) // 2] * 1000, 1) if a_times else -1,
        "a_alone_ms": round(a_alone * 1000, 1), "b_alone_ms": round(b_alone * 1000, 1),
        "b_flood_ms": b, "b_flood_p50_ms": ok[len(ok) // 2] if ok else -1,
        "b_flood_max_ms": ok[-1] if ok else -1, "a_done": done[0], "a_errors": done[1]}))


def burst():
    key, n, max_tokens = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=120)
        s.sendall(completion(key, max_tokens, stream=False))
        socks.append(s)
        time.sleep(0.005)   # arrival order
    res = {"200": 0, "429": 0, "retry_after": 0, "other": 0}
    for s in socks:
        f = s.makefile("rb")
        code, h = read_head(f)
        k = str(code) if str(code) in res else "other"
        res[k] += 1
        if code == 429 and h.get("retry-after"):
            res["retry_after"] += 1
        s.close()
    print(" ".join(f"{k}={v}" for k, v in res.items()))


def silent():
    n, hold = int(sys.argv[3]), float(sys.argv[4])
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
    print(f"opened={len(socks)}", flush=True)
    time.sleep(hold)


def busy():
    key, pad = sys.argv[3], int(sys.argv[4])
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(completion(key, 4, stream=False, body_pad=pad))
    except OSError:
        # what an HTTP client sees when the server closed with its
        # request unread: the send fails, no status is read
        print("reset")
        return
    try:
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        line = data.split(b"\r\n")[0].decode(errors="replace")
        print(f"status={line.split()[1]}" if line.startswith("HTTP/") else "closed")
    except ConnectionResetError:
        print("reset")


def mp_busy():
    """msgpack: connect and at once send N requests of a 60 KB prompt
    (as a client that writes before it reads), then read: the first
    frame's type and code, or "reset" when sending failed."""
    n = int(sys.argv[3])
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        for i in range(n):
            s.sendall(mpk.frame({"type": "request", "id": i + 1, "prompt": "x" * 60000,
                                 "max_tokens": 1}))
    except OSError:
        print("reset")
        return
    try:
        m = mpk.recv_frame(s)
        print(m.get("type") + ":" + m.get("code", ""))
    except (OSError, EOFError):
        print("reset")


def hold():
    key, secs = sys.argv[3], float(sys.argv[4])
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(completion(key, 400))
    s.recv(64)
    print("holding", flush=True)
    time.sleep(secs)
    s.close()


def mp(key):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    out = []
    try:
        if key:
            mpk.send_frame(s, {"type": "auth", "key": key})
            m = mpk.recv_frame(s)
            out.append(m.get("type") + (":" + m.get("tenant", m.get("code", ""))))
            if m.get("type") != "auth_ok":
                raise EOFError
        mpk.send_frame(s, {"type": "request", "id": 7, "prompt": "Once", "max_tokens": 3})
        while True:
            m = mpk.recv_frame(s)
            t = m.get("type")
            out.append(t + (":" + m["code"] if "code" in m else ""))
            if t in ("final", "error", "frame_error"):
                break
    except (EOFError, OSError, ConnectionError):
        out.append("closed")
    print(" ".join(out))


{"ttft": ttft, "burst": burst, "silent": silent, "busy": busy, "hold": hold,
 "mp_busy": mp_busy,
 "mp_nokey": lambda: mp(None), "mp_key": lambda: mp(sys.argv[3])}[mode]()
