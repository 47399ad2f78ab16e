#!/usr/bin/env python3
"""admin_frames.py SOCKET - throw bad frames at a kvd admin socket.

Every case checks the typed error the daemon must answer with (see
ctl/README.md), and that the connection, or a fresh one, still serves a
good request afterwards. Exits 0 when every case passed, 1 otherwise.
Standard library only: frames are packed and parsed by hand.
"""
import socket
import struct
import sys
import time


def pack(o):
    """The msgpack subset the admin protocol uses."""
    if o is None:
        return b"\xc0"
    if o is True:
        return b"\xc3"
    if o is False:
        return b"\xc2"
    if isinstance(o, int):
        if 0 <= o < 128:
            return bytes([o])
        if o >= 0:
            return b"\xcf" + struct.pack(">Q", o)
        return b"\xd3" + struct.pack(">q", o)
    if isinstance(o, str):
        b = o.encode()
        return (bytes([0xa0 | len(b)]) if len(b) < 32 else b"\xd9" + bytes([len(b)])) + b
    if isinstance(o, list):
        return bytes([0x90 | len(o)]) + b"".join(pack(x) for x in o)
    if isinstance(o, dict):
        return bytes([0x80 | len(o)]) + b"".join(pack(k) + pack(v) for k, v in o.items())
    raise TypeError(o)


def unpack(b, i=0):
    t = b[i]
    if t <= 0x7f:
        return t, i + 1
    if 0x80 <= t <= 0x8f or t in (0xde, 0xdf):
        if t <= 0x8f:
            n, i = t & 0x0f, i + 1
        elif t == 0xde:
            n, i = struct.unpack(">H", b[i + 1:i + 3])[0], i + 3
        else:
            n, i = struct.unpack(">I", b[i + 1:i + 5])[0], i + 5
        d = {}
        for _ in range(n):
            k, i = unpack(b, i)
            v, i = unpack(b, i)
            d[k] = v
        return d, i
    if 0x90 <= t <= 0x9f:
        n, i = t & 0x0f, i + 1
        out = []
        for _ in range(n):
            v, i = unpack(b, i)
            out.append(v)
        return out, i
    if 0xa0 <= t <= 0xbf:
        n = t & 0x1f
        return b[i + 1:i + 1 + n].decode(), i + 1 + n
    if t in (0xd9, 0xda, 0xdb):
        w = {0xd9: 1, 0xda: 2, 0xdb: 4}[t]
        n = int.from_bytes(b[i + 1:i + 1 + w], "big")
        return b[i + 1 + w:i + 1 + w + n].decode(), i + 1 + w + n
    if t == 0xc0:
        return None, i + 1
    if t in (0xc2, 0xc3):
        return t == 0xc3, i + 1
    if t in (0xcc, 0xcd, 0xce, 0xcf):
        w = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}[t]
        return int.from_bytes(b[i + 1:i + 1 + w], "big"), i + 1 + w
    if t in (0xd0, 0xd1, 0xd2, 0xd3):
        w = {0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8}[t]
        return int.from_bytes(b[i + 1:i + 1 + w], "big", signed=True), i + 1 + w
    if t == 0xcb:
        return struct.unpack(">d", b[i + 1:i + 9])[0], i + 9
    if t == 0xca:
        return struct.unpack(">f", b[i + 1:i + 5])[0], i + 5
    if t >= 0xe0:
        return t - 256, i + 1
    raise ValueError("type 0x%02x" % t)


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)         # blocking: waits out a full backlog
        self.s.settimeout(5)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def reply(self):
        """One reply map, or None when the daemon closed the connection."""
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack(">I", self.buf[:4])[0]
                if len(self.buf) >= 4 + n:
                    m, end = unpack(self.buf[4:4 + n])
                    assert end == n, "trailing bytes in a reply"
                    self.buf = self.buf[4 + n:]
                    return m
            d = self.s.recv(65536)
            if not d:
                return None
            self.buf += d

    def close(self):
        self.s.close()


failures = []


def check(name, cond, detail=""):
    print("%-4s %s %s" % ("ok" if cond else "FAIL", name, detail))
    if not cond:
        failures.append(name)


def expect_error(c, name, data, code, key=None):
    c.send(data)
    r = c.reply()
    ok = r is not None and r.get("ok") is False and r.get("error") == code
    if key is not None:
        ok = ok and r.get("key") == key
    check(name, ok, repr(r))


def expect_status(c, name):
    c.send(frame(pack({"cmd": "status", "id": 7})))
    r = c.reply()
    check(name, r is not None and r.get("ok") is True and r.get("id") == 7
          and r["result"]["state"] in ("ready", "draining", "drained"), "")


def main():
    path = sys.argv[1]
    bystander = Conn(path)          # an idle client that must not notice
    c = Conn(path)

    # msgpack-level garbage: typed error, connection goes on
    expect_error(c, "reserved byte", frame(b"\xc1"), "malformed")
    expect_error(c, "not a map", frame(pack([1, 2, 3])), "malformed")
    expect_error(c, "empty payload", frame(b""), "malformed")
    expect_error(c, "trailing bytes", frame(pack({"cmd": "status"}) + b"\x00"), "malformed")
    expect_error(c, "huge array count", frame(b"\x81\xa3cmd\xdd\xff\xff\xff\xff"), "malformed")
    expect_error(c, "huge string length", frame(b"\x81\xa3cmd\xdb\x7f\xff\xff\xff"), "malformed")
    deep = b"\x81\xa1a" * 100 + b"\xc0"
    expect_error(c, "nesting too deep", frame(deep), "malformed")
    expect_status(c, "status after garbage")

    # envelope and schema errors
    expect_error(c, "unknown command", frame(pack({"cmd": "reboot"})), "unknown_command")
    expect_error(c, "cmd not a string", frame(pack({"cmd": 5})), "bad_args", "cmd")
    expect_error(c, "no cmd", frame(pack({"id": 1})), "bad_args", "cmd")
    expect_error(c, "id not an integer", frame(pack({"cmd": "status", "id": "x"})), "bad_args", "id")
    expect_error(c, "unknown argument", frame(pack({"cmd": "status", "bogus": 1})), "bad_args", "bogus")
    expect_error(c, "wrong type", frame(pack({"cmd": "pool.resize", "tokens": "12"})), "bad_args", "tokens")
    expect_error(c, "negative", frame(pack({"cmd": "pool.resize", "tokens": -5})), "bad_args", "tokens")
    expect_error(c, "missing argument", frame(pack({"cmd": "abort"})), "bad_args", "request")
    expect_error(c, "both sizes", frame(pack({"cmd": "pool.resize", "tokens": 512, "bytes": 1 << 20})), "bad_args")
    expect_error(c, "bool as int", frame(pack({"cmd": "drain", "wait": 1})), "bad_args", "wait")
    expect_error(c, "duplicate key", frame(b"\x83" + pack("cmd") + pack("abort") + pack("request") + pack(1) + pack("request") + pack(2)), "bad_args", "request")
    expect_error(c, "abort unknown id", frame(pack({"cmd": "abort", "request": 123456789})), "not_found")
    expect_status(c, "status after schema errors")

    # pipelined requests are answered in order, with their ids
    c.send(b"".join(frame(pack({"cmd": "status", "id": i})) for i in range(40)))
    ids = [c.reply().get("id") for _ in range(40)]
    check("pipelined 40 in order", ids == list(range(40)), repr(ids[:5]))

    # a frame dribbled one byte at a time
    data = frame(pack({"cmd": "capacity", "id": 9}))
    for b in data:
        c.send(bytes([b]))
        time.sleep(0.001)
    r = c.reply()
    check("byte-by-byte frame", r is not None and r.get("ok") and r.get("id") == 9, "")

    # oversized length: typed error, then the daemon closes
    c.send(struct.pack(">I", 0xffffffff))
    r = c.reply()
    check("huge length -> too_big", r is not None and r.get("error") == "too_big", repr(r))
    check("closed after too_big", c.reply() is None)
    c.close()

    # just over the limit (64 KiB + 1)
    c = Conn(path)
    c.send(struct.pack(">I", 64 * 1024 + 1) + b"\x80" * 10)
    r = c.reply()
    check("64KiB+1 -> too_big", r is not None and r.get("error") == "too_big", repr(r))
    c.close()

    # a truncated frame and a hang-up: no reply, no harm
    c = Conn(path)
    c.send(struct.pack(">I", 100) + b"\x81\xa3cmd")
    c.s.shutdown(socket.SHUT_WR)
    check("truncated frame then EOF", c.reply() is None)
    c.close()

    # many clients at once, each served
    conns = [Conn(path) for _ in range(20)]
    for i, k in enumerate(conns):
        k.send(frame(pack({"cmd": "status", "id": i})))
    got = [k.reply() for k in conns]
    check("20 concurrent clients", all(g and g.get("ok") and g.get("id") == i for i, g in enumerate(got)))
    for k in conns:
        k.close()

    expect_status(bystander, "idle bystander still served")
    bystander.close()
    c = Conn(path)
    expect_status(c, "fresh connection served")
    c.close()
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
