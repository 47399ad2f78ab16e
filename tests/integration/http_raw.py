#!/usr/bin/env python3
"""tests/integration/http_raw.py - raw HTTP/1.1 cases curl cannot make,
for http_api.sh. Each prints one line the test greps and exits 0 unless
the socket itself failed.

    http_raw.py PORT slow HEADER_WAIT_S    send half a request head, wait:
                                           prints the status kvd sent (or
                                           "closed") and whether it closed
    http_raw.py PORT idle WAIT_S KEY       one keep-alive request, then
                                           wait: "closed" or "open"
    http_raw.py PORT idlecrlf WAIT_S KEY   as idle, but trickle a bare CRLF
                                           (which starts no request) every
                                           0.3 s while waiting
    http_raw.py PORT pipeline KEY          two requests in one write:
                                           prints both statuses and ids
    http_raw.py PORT leave KEY TOKENS      stream a completion, read the
                                           first event, then vanish
    http_raw.py PORT noread KEY TOKENS S   20 pipelined streams, never read for
                                           S seconds: "closed" or "open"
    http_raw.py PORT leave0 KEY TOKENS     send a completion, vanish 100 ms
                                           later (mid-transfer with
                                           prefill's slow_batch)
    http_raw.py PORT badkeys N             N pipelined GET /v1/models with
                                           a wrong key on one connection:
                                           "answers=N status401=M"
    http_raw.py PORT early KEY LENGTH [S]  a completion's head (KEY, which
                                           may be "-" for none, Content-
                                           Length LENGTH) and never its
                                           body: "status=S ms=T closed"
                                           (or "open"), or "none" when no
                                           answer came within S (5) s
    http_raw.py PORT late WAIT_S           connect, say nothing for WAIT_S,
                                           then trickle a head (a header
                                           byte every 0.2 s, never done):
                                           "status=S ms=T" from connect
                                           ("open" after 20 s)
    http_raw.py PORT expect KEY WHEN       a completion with `Expect:
                                           100-continue`; WHEN "with": its
                                           body in the same write; "after":
                                           the head, up to 2 s for an
                                           interim answer, then the body.
                                           Prints "statuses=A,B" (every
                                           status line kvd sent, in order)
"""
import json
import socket
import sys
import time

port = int(sys.argv[1])
mode = sys.argv[2]


def conn():
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def req(path, body, key, extra=""):
    b = json.dumps(body).encode()
    h = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         f"Authorization: Bearer {key}\r\nContent-Length: {len(b)}\r\n{extra}\r\n")
    return h.encode() + b


def read_response(s):
    """One response with a Content-Length body: (status, body)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            return None, buf
        buf += d
    head, rest = buf.split(b"\r\n\r\n", 1)
    status = int(head.split()[1])
    n = 0
    for line in head.split(b"\r\n")[1:]:
        k, v = line.split(b":", 1)
        if k.strip().lower() == b"content-length":
            n = int(v)
    while len(rest) < n:
        d = s.recv(65536)
        if not d:
            break
        rest += d
    return status, rest[:n], rest[n:]


def read_head(s, secs):
    """Bytes until the end of a head ("\\r\\n\\r\\n"), EOF or secs."""
    s.settimeout(secs)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            d = s.recv(65536)
            if not d:
                break
            data += d
    except socket.timeout:
        pass
    return data


def closed_within(s, secs):
    s.settimeout(secs)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return True
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


if mode == "slow":
    s = conn()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-")
    s.settimeout(float(sys.argv[3]))
    data = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
    except socket.timeout:
        print("still-open")
        sys.exit(0)
    status = data.split()[1].decode() if data else "none"
    print(f"status={status} closed")
elif mode == "idle":
    s = conn()
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
              + sys.argv[4].encode() + b"\r\n\r\n")
    st, body, _ = read_response(s)
    print(f"status={st}", "closed" if closed_within(s, float(sys.argv[3])) else "open")
elif mode == "idlecrlf":
    s = conn()
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
              + sys.argv[4].encode() + b"\r\n\r\n")
    st, body, _ = read_response(s)
    end = time.monotonic() + float(sys.argv[3])
    closed = False
    while not closed and time.monotonic() < end:
        try:
            s.sendall(b"\r\n")
        except OSError:
            closed = True
            break
        s.settimeout(0.3)
        try:
            d = s.recv(65536)
            if d:   # a CRLF between requests is no request: no answer
                print(f"status={st} answered={d[:12]!r}")
                sys.exit(0)
            closed = True
        except socket.timeout:
            pass
        except ConnectionResetError:
            closed = True
    print(f"status={st}", "closed" if closed else "open")
elif mode == "pipeline":
    s = conn()
    key = sys.argv[3]
    one = req("/v1/completions", {"prompt": "Once upon", "max_tokens": 3, "temperature": 0}, key)
    two = (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
           + key.encode() + b"\r\n\r\n")
    s.sendall(one + two)
    st1, b1, rest = read_response(s)
    # the second answer may already be in `rest`
    s2 = type("S", (), {})()
    pending = [rest]

    def recv(n):
        if pending and pending[0]:
            d = pending.pop(0)
            return d
        return s.recv(n)
    s2.recv = recv
    st2, b2, _ = read_response(s2)
    o1 = json.loads(b1)
    o2 = json.loads(b2)
    print(f"first={st1} object={o1.get('object')} second={st2} object={o2.get('object')}")
elif mode == "leave":
    s = conn()
    s.sendall(req("/v1/completions", {"prompt": "Once upon a time", "max_tokens": int(sys.argv[4]),
                                      "temperature": 0, "stream": True}, sys.argv[3]))
    buf = b""
    while b"data: " not in buf:
        d = s.recv(65536)
        if not d:
            break
        buf += d
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()   # RST: the client is gone mid-stream
    print("left" if b"data: " in buf else "no-event")
elif mode == "leave0":
    s = conn()
    s.sendall(req("/v1/completions", {"prompt": "Once upon a time", "max_tokens": int(sys.argv[4]),
                                      "temperature": 0}, sys.argv[3]))
    time.sleep(0.1)   # prefill's slow_batch holds the transfer 300 ms
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()
    print("left")
elif mode == "noread":
    # a small receive buffer: what kvd writes piles up in kvd, not in the
    # kernel; never read, wait, then say whether kvd closed us
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    # pipelined: kvd answers them one after the other into our full buffer
    s.sendall(b"".join(req("/v1/completions", {"prompt": "The end of the story",
                                               "max_tokens": int(sys.argv[4]), "temperature": 0.9,
                                               "seed": 3, "stream": True}, sys.argv[3])
                       for _ in range(int(sys.argv[6]) if len(sys.argv) > 6 else 20)))
    time.sleep(float(sys.argv[5]))
    s.setblocking(False)
    closed = False
    try:
        while True:
            d = s.recv(1 << 20)
            if not d:
                closed = True
                break
    except BlockingIOError:
        pass
    except ConnectionResetError:
        closed = True
    print("closed" if closed else "open")
elif mode == "badkeys":
    n = int(sys.argv[3])
    s = conn()
    s.sendall(b"".join(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                       b"Authorization: Bearer wrong-key-%08d\r\n\r\n" % i
                       for i in range(n)))
    buf = b""
    answers = s401 = 0
    while answers < n:
        while b"\r\n\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                break
            buf += d
        if b"\r\n\r\n" not in buf:
            break
        head, buf = buf.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, v = line.split(b":", 1)
            if k.strip().lower() == b"content-length":
                length = int(v)
        while len(buf) < length:
            d = s.recv(65536)
            if not d:
                break
            buf += d
        buf = buf[length:]
        answers += 1
        s401 += int(head.split()[1]) == 401
    print(f"answers={answers} status401={s401}")
elif mode == "early":
    key, length = sys.argv[3], int(sys.argv[4])
    s = conn()
    t0 = time.monotonic()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\n"
              + (b"Authorization: Bearer " + key.encode() + b"\r\n" if key != "-" else b"")
              + b"Content-Length: %d\r\n\r\n" % length)
    data = read_head(s, float(sys.argv[5]) if len(sys.argv) > 5 else 5)
    if b"\r\n\r\n" not in data:
        print("none")
        sys.exit(0)
    ms = int((time.monotonic() - t0) * 1000)
    status = data.split()[1].decode()
    print(f"status={status} ms={ms}", "closed" if closed_within(s, 5) else "open")
elif mode == "late":
    s = conn()
    t0 = time.monotonic()
    time.sleep(float(sys.argv[3]))
    data = b""
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        s.settimeout(0.2)
        while time.monotonic() - t0 < 20:
            try:
                d = s.recv(65536)
                if not d:
                    break
                data += d
            except socket.timeout:
                s.sendall(b"X")   # a header name that never ends
    except OSError:
        pass
    ms = int((time.monotonic() - t0) * 1000)
    if time.monotonic() - t0 >= 20:
        print("open")
    else:
        print(f"status={data.split()[1].decode() if data else 'none'} ms={ms}")
elif mode == "expect":
    key, when = sys.argv[3], sys.argv[4]
    body = json.dumps({"prompt": "Once upon", "max_tokens": 2, "temperature": 0}).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + key.encode() + b"\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    s = conn()
    data = b""
    if when == "with":
        s.sendall(head + body)
    else:
        s.sendall(head)
        data = read_head(s, 2)
        try:
            s.sendall(body)
        except OSError:
            pass
    s.settimeout(10)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
            if b"\r\n\r\n{" in data and data.rstrip().endswith(b"}"):
                break
    except (socket.timeout, ConnectionResetError):
        pass
    print("statuses=" + ",".join(l.split()[1].decode() for l in data.split(b"\r\n")
                                 if l.startswith(b"HTTP/1.")))
else:
    sys.exit(f"unknown mode {mode}")
