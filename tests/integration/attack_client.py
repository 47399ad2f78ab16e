#!/usr/bin/env python3
"""attack_client.py CMD ... - hostile clients for kvd's client API.

Each subcommand plays one attack against a node's client socket
(host:port, or unix:PATH) and prints one JSON line with what it saw; the
shell test (client_limits.sh) judges it. Every loop is bounded in time.
Standard library only: msgpack is packed and parsed by hand.

  noread ADDR SECONDS PID    send requests, never read; report peak RSS
                             growth of PID and whether kvd closed us
  slowloris ADDR N SECONDS   N connections each sending a frame 1 byte/s;
                             report when each was closed
  idle ADDR N SECONDS        N connections that send nothing
  late ADDR WAIT             one connection silent for WAIT s, then a
                             frame 1 byte per 0.1 s (never the last):
                             when kvd closed it, from connect
  flood ADDR N HOLD READY    open N connections; count OVERLOADED frame
                             errors; touch READY, hold the rest HOLD s
  halfclose ADDR N MAXTOK    N clients: one request, shutdown(SHUT_WR),
                             read to the end; count final events
  id0 ADDR                   request id 0 and a malformed frame on one
                             connection; list the events received
"""
import json
import os
import select
import socket
import struct
import sys
import time

from mpk import frame, pack, unpack


def request(rid, max_tokens, long=False):
    """A request; `long` ones run to max_tokens on the test model (this
    prompt and seed do not sample the end-of-sequence token)."""
    r = {"type": "request", "id": rid, "max_tokens": max_tokens,
         "prompt": "Once upon a time"}
    if long:
        r.update(prompt="The end of the story", temperature=0.9, seed=3)
    return frame(r)


def connect(addr, timeout=5.0, rcvbuf=0):
    """rcvbuf: a small receive buffer so that what kvd writes to a client
    that does not read piles up in kvd, not in the kernel (quick test)."""
    if addr.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    if addr.startswith("unix:"):
        s.connect(addr[5:])
    else:
        host, port = addr.rsplit(":", 1)
        s.connect((host, int(port)))
    return s


class Events:
    """Frames read from one socket."""

    def __init__(self, s):
        self.s, self.buf, self.eof = s, b"", False

    def feed(self):
        """Read what is there; False once the peer closed or reset."""
        try:
            d = self.s.recv(65536)
        except (BlockingIOError, socket.timeout):
            return True
        except OSError:
            d = b""
        if not d:
            self.eof = True
            return False
        self.buf += d
        return True

    def pop(self):
        out = []
        while len(self.buf) >= 4:
            n = struct.unpack(">I", self.buf[:4])[0]
            if len(self.buf) < 4 + n:
                break
            out.append(unpack(self.buf[4:4 + n])[0])
            self.buf = self.buf[4 + n:]
        return out


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def peer_closed(s):
    """kvd closed (FIN or RST) a socket we never read from: TCP_INFO's
    first byte is the state; ESTABLISHED is 1. Unix sockets: probe with a
    zero-length peek is not possible without reading, so send nothing and
    check POLLHUP."""
    if s.family == socket.AF_INET:
        st = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
        return st != 1
    p = select.poll()
    p.register(s, select.POLLHUP | select.POLLRDHUP)
    return any(ev & (select.POLLHUP | select.POLLRDHUP) for _, ev in p.poll(0))


def cmd_noread(addr, seconds, pid):
    seconds, pid = float(seconds), int(pid)
    s = connect(addr, rcvbuf=4096)
    s.setblocking(False)
    base = rss_kb(pid)
    peak, sent, rid, pending = base, 0, 1, b""
    closed_at = None
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if closed_at is not None and time.monotonic() - t0 > closed_at + 2:
            break
        if closed_at is None:
            if not pending:
                pending = request(rid, 400, long=True)
                rid += 1
            try:
                n = s.send(pending)
                pending = pending[n:]
                if not pending:
                    sent += 1
            except BlockingIOError:
                pass
            except OSError:
                closed_at = time.monotonic() - t0
            if closed_at is None and peer_closed(s):
                closed_at = time.monotonic() - t0
        peak = max(peak, rss_kb(pid))
        time.sleep(0.002 if closed_at is None else 0.1)
    print(json.dumps({"sent": sent, "rss_base_kb": base, "rss_peak_kb": peak,
                      "growth_kb": peak - base, "closed_at": closed_at}))


def cmd_slowloris(addr, n, seconds, data=None):
    n, seconds = int(n), float(seconds)
    body = request(1, 4) if data is None else data
    conns = []
    for _ in range(n):
        s = connect(addr)
        s.setblocking(False)
        conns.append([s, 0, None])
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds and any(c[2] is None for c in conns):
        for c in conns:
            s = c[0]
            if c[2] is not None:
                continue
            try:
                if s.recv(4096, socket.MSG_DONTWAIT) == b"":
                    c[2] = time.monotonic() - t0
                    continue
            except BlockingIOError:
                pass
            except OSError:
                c[2] = time.monotonic() - t0
                continue
            if c[1] < len(body) - 1:    # never the last byte
                try:
                    s.send(body[c[1]:c[1] + 1])
                    c[1] += 1
                except OSError:
                    c[2] = time.monotonic() - t0
        time.sleep(1.0 if data is None else 0.1)
    closed = [c[2] for c in conns if c[2] is not None]
    print(json.dumps({"conns": n, "closed": len(closed),
                      "max_close_s": max(closed) if closed else None}))


def cmd_idle(addr, n, seconds):
    cmd_slowloris(addr, n, seconds, data=b"")


def cmd_late(addr, wait):
    s = connect(addr)
    t0 = time.monotonic()
    time.sleep(float(wait))
    body = request(1, 4)
    closed, i = None, 0
    s.settimeout(0.1)
    while closed is None and time.monotonic() - t0 < 20:
        try:
            if i < len(body) - 1:
                s.send(body[i:i + 1])
                i += 1
            if s.recv(4096) == b"":
                closed = time.monotonic() - t0
        except socket.timeout:
            pass
        except OSError:
            closed = time.monotonic() - t0
    print(json.dumps({"closed_s": closed, "bytes": i}))


def cmd_flood(addr, n, hold, ready):
    """Connections past max_clients are refused at once; the ones held
    are counted half a second in (before any read timeout)."""
    n, hold = int(n), float(hold)
    conns, refused, other, failed = [], 0, 0, 0
    for _ in range(n):
        try:
            conns.append(connect(addr, 2.0))
        except OSError:
            failed += 1
    evs = {s: Events(s) for s in conns}
    for s in conns:
        s.setblocking(False)
    open_ = set(conns)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline and open_:
        r, _, _ = select.select(list(open_), [], [], 0.05)
        for s in r:
            alive = evs[s].feed()
            for ev in evs[s].pop():
                if (ev.get("type") == "frame_error" and "id" not in ev and
                        ev.get("code") == "OVERLOADED"):
                    refused += 1
                else:
                    other += 1
            if not alive:
                open_.discard(s)
    held = len(open_)
    with open(ready, "w") as f:
        f.write("%d\n" % held)
    time.sleep(hold)
    for s in conns:
        s.close()
    print(json.dumps({"conns": n, "overloaded": refused, "held": held,
                      "other": other, "connect_failed": failed}))


def cmd_halfclose(addr, n, max_tokens):
    n, max_tokens = int(n), int(max_tokens)
    evs = {}
    for i in range(n):
        s = connect(addr)
        s.sendall(request(i + 1, max_tokens))
        s.shutdown(socket.SHUT_WR)
        s.setblocking(False)
        evs[s] = Events(s)
    finals, errors, open_ = 0, 0, set(evs)
    deadline = time.monotonic() + 60.0
    while open_ and time.monotonic() < deadline:
        r, _, _ = select.select(list(open_), [], [], 0.5)
        for s in r:
            alive = evs[s].feed()
            for ev in evs[s].pop():
                finals += ev.get("type") == "final"
                errors += ev.get("type") == "error"
            if not alive:
                open_.discard(s)
                s.close()
    print(json.dumps({"clients": n, "finals": finals, "errors": errors,
                      "still_open": len(open_)}))


def cmd_id0(addr):
    s = connect(addr, 30.0)
    s.sendall(request(0, 8))
    s.sendall(frame(b"\x01\x02\x03"))          # not a msgpack map
    e = Events(s)
    got = []
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and len(got) < 64:
        got += e.pop()
        terminal0 = [g for g in got if g.get("id") == 0 and
                     g.get("type") in ("final", "error")]
        frame_errs = [g for g in got if "id" not in g]
        if terminal0 and frame_errs:
            break
        if not e.feed():
            break
    s.close()
    print(json.dumps({"events": [{k: v for k, v in g.items()
                                  if k in ("type", "id", "code")}
                                 for g in got if g.get("type") != "token"]}))


if __name__ == "__main__":
    cmds = {"noread": cmd_noread, "slowloris": cmd_slowloris,
            "idle": cmd_idle, "late": cmd_late, "flood": cmd_flood,
            "halfclose": cmd_halfclose, "id0": cmd_id0}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](*sys.argv[2:])
