"""mpk.py - the msgpack subset kvd's frames use, and length-prefixed
frames (net/wire/frame.h), for the integration tests' hand-rolled clients and
peers. Standard library only; shared by fake_peer.py, attack_client.py and
admin_frames.py, which import it from this directory.
"""
import struct


def pack(o):
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
    if isinstance(o, float):
        return b"\xcb" + struct.pack(">d", o)
    if isinstance(o, (str, bytes)):
        b = o.encode("utf-8", "surrogateescape") if isinstance(o, str) else o
        if len(b) < 32:
            return bytes([0xa0 | len(b)]) + b
        if len(b) < 256:
            return b"\xd9" + bytes([len(b)]) + b
        if len(b) < 65536:
            return b"\xda" + struct.pack(">H", len(b)) + b
        return b"\xdb" + struct.pack(">I", len(b)) + b
    if isinstance(o, (list, tuple)):
        head = bytes([0x90 | len(o)]) if len(o) < 16 else b"\xdc" + struct.pack(">H", len(o))
        return head + b"".join(pack(x) for x in o)
    if isinstance(o, dict):
        head = bytes([0x80 | len(o)]) if len(o) < 16 else b"\xde" + struct.pack(">H", len(o))
        return head + b"".join(pack(k) + pack(v) for k, v in o.items())
    raise TypeError(o)


def unpack(b, i=0):
    t = b[i]
    if t <= 0x7f:
        return t, i + 1
    if t >= 0xe0:
        return t - 0x100, i + 1
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
    if 0x90 <= t <= 0x9f or t in (0xdc, 0xdd):
        if t <= 0x9f:
            n, i = t & 0x0f, i + 1
        elif t == 0xdc:
            n, i = struct.unpack(">H", b[i + 1:i + 3])[0], i + 3
        else:
            n, i = struct.unpack(">I", b[i + 1:i + 5])[0], i + 5
        out = []
        for _ in range(n):
            v, i = unpack(b, i)
            out.append(v)
        return out, i
    if 0xa0 <= t <= 0xbf:
        n = t & 0x1f
        return b[i + 1:i + 1 + n].decode("utf-8", "replace"), i + 1 + n
    if t in (0xd9, 0xda, 0xdb, 0xc4, 0xc5, 0xc6):
        w = {0xd9: 1, 0xda: 2, 0xdb: 4, 0xc4: 1, 0xc5: 2, 0xc6: 4}[t]
        n = int.from_bytes(b[i + 1:i + 1 + w], "big")
        raw = b[i + 1 + w:i + 1 + w + n]
        return (raw.decode("utf-8", "replace") if t >= 0xd9 else raw), i + 1 + w + n
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
    if t == 0xca:
        return struct.unpack(">f", b[i + 1:i + 5])[0], i + 5
    if t == 0xcb:
        return struct.unpack(">d", b[i + 1:i + 9])[0], i + 9
    raise ValueError("msgpack type 0x%02x" % t)


def frame(obj):
    """A whole frame: 4-byte big-endian length, then the payload (obj
    packed, or bytes as they are)."""
    p = obj if isinstance(obj, (bytes, bytearray)) else pack(obj)
    return struct.pack(">I", len(p)) + bytes(p)


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return bytes(buf)


def send_frame(sock, msg):
    body = pack(msg)
    sock.sendall(struct.pack(">I", len(body)) + body)


def recv_frame(sock):
    n = struct.unpack(">I", recv_exact(sock, 4))[0]
    return unpack(recv_exact(sock, n))[0]
