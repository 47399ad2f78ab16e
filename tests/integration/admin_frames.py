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

from mpk import frame, pack, unpack


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
    expect_error(c, "abort by both ids", frame(pack({"cmd": "abort", "request": 1, "public_id": "cmpl-0"})), "bad_args", "request")
    expect_error(c, "abort unknown public id", frame(pack({"cmd": "abort", "public_id": "cmpl-00"})), "not_found")
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
