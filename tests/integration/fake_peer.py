#!/usr/bin/env python3
"""fake_peer.py - a hand-rolled decode peer for the integration tests.

It speaks the peer protocol of net/PROTOCOL.md (section 2: hello on a
control connection, then {type:"data", token} on a data connection;
section 3: binary KV batches) with the standard library only (and, for
keyed links, libsodium through ctypes: the AEAD), so a test
can send a prefill node what a real decode node never would and read
exactly what prefill puts on the wire. The hello's figures (model
fingerprint, KV layout) are read from the prefill node's own log, so the
fake needs no copy of the model.

  fake_peer.py hello ADDR LOG NODE [SHA]
                                     send one hello whose `node` is NODE and,
                                     if given, whose model_sha256 is SHA
                                     (a mismatch: refused); escapes like \\n
                                     are decoded; print what came back
  fake_peer.py stranger ADDR LOG     a peer without the key tries every way in
                                     (plain hello, wrong proof, a request
                                     before any proof, a forged data token);
                                     prints one JSON line per attempt: what
                                     came back (exit 0 when each got a bare
                                     refusal and nothing else)
  fake_peer.py [--key FILE] hijack ADDR SECONDS [LOG]
                                     open data connections with guessed
                                     tokens as fast as prefill answers (with
                                     LOG: after pairing itself, also its own
                                     token's neighbours); prints how many
                                     and how many KV bytes came back
  fake_peer.py bigframes ADDR N MIB SECONDS
                                     N connections each start a 4 MiB frame
                                     and send MIB MiB of it before any proof
  fake_peer.py crowd ADDR N SECONDS  open N silent connections; report how many
                                     were closed at once and after SECONDS
  fake_peer.py --key FILE mute ADDR LOG CONNS SECONDS SOURCE
                                     a key holder proving the key on CONNS
                                     connections from SOURCE, then silent
                                     (no hello), reopening each closed one
  fake_peer.py rogue LISTEN SECONDS MODE
                                     a prefill impostor without the key at a
                                     decode node's configured address (MODE
                                     proof: answers with a guessed proof;
                                     plain: answers auth_hello with a hello;
                                     suite: a challenge naming another
                                     integrity suite);
                                     prints every message type decode sent
  fake_peer.py [--key FILE] badreq ADDR LOG
                                     prefill_requests prefill must refuse
                                     before reserving anything (too few /
                                     too many destination pages, a token id
                                     outside the vocabulary, a tenant
                                     that breaks the keys file's rule:
                                     a quote, newline and '=', 64
                                     characters), then a good one of
                                     tenant carol; prints one JSON line per case:
                                     what prefill answered
  fake_peer.py ackflood LISTEN LOG N SECONDS
                                     a keyless prefill at a decode node's
                                     configured address (LOG: decode's, for
                                     the layout): pair, heartbeat, wait for
                                     one prefill_request, answer it with N
                                     abort_acks nobody asked for, then a
                                     prefill_reject; prints "handshake=ok
                                     acks=N id=ID"
  fake_peer.py --key FILE tamper ADDR LOG
                                     a keyed decode that proves the key, then
                                     sends its sealed hello with one bit of
                                     the tag flipped; prints "closed=1" when
                                     prefill closed the connection without
                                     a byte in answer (exit 0), else what
                                     came back (exit 1)
  fake_peer.py relay LISTEN TARGET SECONDS
                                     a man in the middle without the key:
                                     accept on LISTEN, connect to TARGET and
                                     copy bytes both ways (a decode's
                                     handshake relayed to another node);
                                     prints "relayed=N bytes_up=.. bytes_down=.."
  fake_peer.py caplines LOG          print node and pool_tokens of every
                                     event=kv_capacity line (quote-aware)
  fake_peer.py [--key FILE] tail ADDR LOG
                                     run a 1-token prefill_request into a
                                     fake page and check that every byte of
                                     positions >= 1 of every K/V block of
                                     the received page is zero (exit 0),
                                     else print where it is not (exit 1)

Everything the protocol needs lives in the FakeDecode class, so a later
handshake (authentication before hello) is one method to add.
"""
import ctypes
import ctypes.util
import hashlib
import os
import re
import socket
import struct
import sys

from mpk import pack, recv_exact, recv_frame, send_frame, unpack

PROTO_VERSION = 3
SUITE = "chacha20-poly1305"   # PROTO_PEER_SUITE

# ---- what the prefill node says about itself in its log ----------------------


def log_pairs(line):
    """key=value pairs of one log line (quoted values unescaped)."""
    out = {}
    for m in re.finditer(r'([A-Za-z0-9_.-]+)=("(?:[^"\\]|\\.)*"|\S*)', line):
        v = m.group(2)
        if v.startswith('"'):
            v = re.sub(r'\\x([0-9a-fA-F]{2})|\\(.)',
                       lambda x: chr(int(x.group(1), 16)) if x.group(1) else x.group(2),
                       v[1:-1])
        out[m.group(1)] = v
    return out


def layout_from_log(path):
    """The hello figures a decode peer must match, from the node's log."""
    cap = loaded = None
    with open(path, errors="replace") as f:
        for line in f:
            if " event=kv_capacity " in line:
                cap = log_pairs(line)
            elif " event=model_loaded " in line:
                loaded = log_pairs(line)
    if not cap or not loaded:
        raise SystemExit("fake_peer: no kv_capacity/model_loaded line in " + path)
    head_dim = int(loaded["embd"]) // int(loaded["heads"])
    return {
        "model_sha256": cap["model_sha256"],
        "kv_dtype": cap["kv_dtype"],
        "page_tokens": int(cap["page_tokens"]),
        "page_bytes": int(cap["page_bytes"]),
        "n_layer": int(loaded["layers"]),
        "kv_dim": int(loaded["kv_heads"]) * head_dim,
    }


# ---- the peer ---------------------------------------------------------------


def split_addr(addr):
    host, port = addr.rsplit(":", 1)
    return host, int(port)


# ---- keyed links (net/peer_auth.c, mirrored) ----------------------------------

_sodium = None


def sodium():
    global _sodium
    if _sodium is None:
        _sodium = ctypes.CDLL(ctypes.util.find_library("sodium") or "libsodium.so.23")
        if _sodium.sodium_init() < 0:
            raise OSError("sodium_init failed")
    return _sodium


def mac(key, label, nd, np_):
    h = hashlib.blake2b(digest_size=32, key=key)
    h.update(label.encode() + b"\0" + nd + np_)
    return h.digest()


def ids_mac(key, label, nd, np_, names_addrs):
    """A proof (net/PROTOCOL.md s. 2.1): the nonces, then each of name_d,
    name_p, addr_d, addr_p as one length byte and its bytes."""
    h = hashlib.blake2b(digest_size=32, key=key)
    h.update(label.encode() + b"\0" + nd + np_)
    for v in names_addrs:
        b = v.encode()
        h.update(bytes([len(b)]) + b)
    return h.digest()


def sock_addr(addr):
    return "%s:%d" % (addr[0], addr[1])


def seal_name(aead, name):
    """A node name for auth_proof: NUL-padded to 64 bytes, encrypted
    under the sender's control key (its counter 0)."""
    enc = Aead(aead.key, True)
    enc.seq = aead.seq
    box = enc.seal(name.encode().ljust(64, b"\0")[:64], 0)
    aead.seq = enc.seq
    return box.hex()


def open_name(aead, hexbox):
    dec = Aead(aead.key, True)
    dec.seq = aead.seq
    plain = dec.open(bytes.fromhex(hexbox), 0)
    aead.seq = dec.seq
    return plain.split(b"\0", 1)[0].decode()


def cluster_key(material):
    return hashlib.blake2b(b"kvd/2 cluster key\0" + material, digest_size=32).digest()


class Aead:
    """One direction: ChaCha20-Poly1305 (IETF), 64-bit counter nonce."""

    def __init__(self, key, encrypt):
        self.key, self.encrypt, self.seq = key, encrypt, 0

    def _nonce(self):
        n = b"\0" * 4 + struct.pack("<Q", self.seq)
        self.seq += 1
        return n

    def seal(self, buf, ad_n):
        ad = buf[:ad_n] if self.encrypt else buf
        msg = buf[ad_n:] if self.encrypt else b""
        c = ctypes.create_string_buffer(len(msg) or 1)
        tag = ctypes.create_string_buffer(16)
        sodium().crypto_aead_chacha20poly1305_ietf_encrypt_detached(
            c, tag, None, msg, ctypes.c_ulonglong(len(msg)), ad,
            ctypes.c_ulonglong(len(ad)), None, self._nonce(), self.key)
        return (buf[:ad_n] + c.raw[:len(msg)] if self.encrypt else buf) + tag.raw

    def open(self, buf, ad_n):
        body, tag = buf[:-16], buf[-16:]
        ad = body[:ad_n] if self.encrypt else body
        msg = body[ad_n:] if self.encrypt else b""
        m = ctypes.create_string_buffer(len(msg) or 1)
        if sodium().crypto_aead_chacha20poly1305_ietf_decrypt_detached(
                m, None, msg, ctypes.c_ulonglong(len(msg)), tag, ad,
                ctypes.c_ulonglong(len(ad)), self._nonce(), self.key) != 0:
            raise ValueError("a sealed frame or batch failed to open")
        return body[:ad_n] + m.raw[:len(msg)] if self.encrypt else body


class FakeDecode:
    """A decode peer: control connection, data connection, KV batches."""

    def __init__(self, addr, layout, timeout=20.0, key=None, encrypt=False):
        self.addr = split_addr(addr)
        self.layout = layout
        self.timeout = timeout
        self.ctl = None
        self.data = None
        self.session = None
        self.key = cluster_key(key) if key else None
        self.encrypt = encrypt
        self.tx = self.rx = self.data_aead = None

    def send(self, msg):
        if self.tx is None:
            send_frame(self.ctl, msg)
            return
        body = self.tx.seal(pack(msg), 0)
        self.ctl.sendall(struct.pack(">I", len(body)) + body)

    def recv(self):
        if self.rx is None:
            return recv_frame(self.ctl)
        n = struct.unpack(">I", recv_exact(self.ctl, 4))[0]
        return unpack(self.rx.open(recv_exact(self.ctl, n), 0))[0]

    def authenticate(self, me="fake-decode"):
        """Keyed links: prove the cluster key, check prefill's proof,
        derive the link's keys (net/PROTOCOL.md s. 2.1)."""
        nd = os.urandom(32)
        send_frame(self.ctl, {"type": "auth_hello", "version": PROTO_VERSION,
                              "nonce": nd.hex(), "suite": SUITE})
        ch = recv_frame(self.ctl)
        if ch.get("type") != "auth_challenge":
            return ch
        np_ = bytes.fromhex(ch["nonce"])
        self.tx = Aead(mac(self.key, "kvd/2 ctl decode->prefill", nd, np_), self.encrypt)
        self.rx = Aead(mac(self.key, "kvd/2 ctl prefill->decode", nd, np_), self.encrypt)
        ad, ap = sock_addr(self.ctl.getsockname()), sock_addr(self.ctl.getpeername())
        send_frame(self.ctl, {"type": "auth_proof",
                              "proof": ids_mac(self.key, "kvd/3 proof decode", nd, np_,
                                               [me, "", ad, ap]).hex(),
                              "name": seal_name(self.tx, me)})
        pr = recv_frame(self.ctl)
        if pr.get("type") != "auth_proof":
            return pr
        try:
            them = open_name(self.rx, pr.get("name", ""))
        except ValueError:
            return pr
        if bytes.fromhex(pr["proof"]) != ids_mac(self.key, "kvd/3 proof prefill", nd, np_,
                                                 [me, them, ad, ap]):
            return pr
        self.data_aead = Aead(mac(self.key, "kvd/2 data prefill->decode", nd, np_), self.encrypt)
        self.session = mac(self.key, "kvd/2 data token", nd, np_).hex()
        return None

    def hello_msg(self, **over):
        h = {"type": "hello", "version": PROTO_VERSION, "role": "decode", "node": "fake-decode",
             "pool_tokens": 1 << 20, "context": 1 << 20,
             "max_batch_bytes": 64 << 20, "checksum": False}
        h.update(self.layout)
        h.update(over)
        return h

    def connect(self):
        self.ctl = socket.create_connection(self.addr, timeout=self.timeout)

    def hello(self, **over):
        """Send our hello; return prefill's (None if it closed instead)."""
        if self.ctl is None:
            self.connect()
        try:
            if self.key is not None:
                refused = self.authenticate(self.hello_msg(**over)["node"])
                if refused is not None:
                    return refused
            self.send(self.hello_msg(**over))
            reply = self.recv()
        except (EOFError, OSError, ValueError):
            return None
        if reply.get("type") == "hello" and self.key is None:
            self.session = reply.get("session")
        return reply

    def open_data(self):
        """The data connection, bound by the token (prefill's, keyless);
        prefill confirms with data_bound before any request may follow."""
        self.data = socket.create_connection(self.addr, timeout=self.timeout)
        send_frame(self.data, {"type": "data", "token": self.session})
        m = self.next_msg()
        if m.get("type") != "data_bound":
            raise ValueError("expected data_bound, got %r" % (m,))

    def prefill_request(self, rid, tokens, pages, max_tokens=1, tenant=None):
        m = {"type": "prefill_request", "id": rid,
             "tokens": list(tokens),
             "pages": [list(p) for p in pages],
             "max_tokens": max_tokens, "temperature": 0.0,
             "top_k": 0, "top_p": 1.0, "seed": 0}
        if tenant is not None:
            m["tenant"] = tenant
        self.send(m)

    def next_msg(self, skip=("heartbeat",)):
        while True:
            m = self.recv()
            if m.get("type") not in skip:
                return m

    def read_batch(self):
        """One KV batch: (header dict, [entry dict], [page bytes])."""
        raw = recv_exact(self.data, 64)
        magic, ver, flags, rid, seq, n, page_bytes, payload, csum = \
            struct.unpack("<IHHQIIQQQ", raw[:48])
        if magic != 0x3158564b:
            raise ValueError("bad batch magic 0x%08x" % magic)
        rest = recv_exact(self.data, n * (24 + page_bytes) + (16 if flags & 2 else 0))
        if flags & 2:
            rest = self.data_aead.open(raw + rest, 64)[64:]
        entries = []
        for i in range(n):
            page, index, gen, tokens, _z = struct.unpack("<IIQII", rest[24 * i:24 * i + 24])
            entries.append({"dst_page": page, "index": index, "dst_gen": gen,
                            "tokens": tokens})
        base = 24 * n
        pages = [rest[base + i * page_bytes:base + (i + 1) * page_bytes] for i in range(n)]
        hdr = {"request_id": rid, "seq": seq, "n_entries": n, "flags": flags,
               "page_bytes": page_bytes, "payload_bytes": payload}
        return hdr, entries, pages

    def close(self):
        for s in (self.data, self.ctl):
            if s is not None:
                s.close()


# ---- checks -----------------------------------------------------------------


def stale_bytes(layout, page, tokens):
    """[(layer, 'K'|'V', first nonzero offset)] in positions >= tokens."""
    elt = 4 if layout["kv_dtype"] == "f32" else 2
    pt, d = layout["page_tokens"], layout["kv_dim"]
    block = pt * d * elt
    bad = []
    for layer in range(layout["n_layer"]):
        for kv in (0, 1):
            off = 64 + (2 * layer + kv) * block
            tail = page[off + tokens * d * elt:off + block]
            if tail.count(0) != len(tail):
                first = next(i for i, c in enumerate(tail) if c)
                bad.append((layer, "KV"[kv], tokens * d * elt + first))
    return bad


def cmd_hello(addr, log, node, sha=None):
    fake = FakeDecode(addr, layout_from_log(log), timeout=5.0)
    node = node.encode().decode("unicode_escape")
    over = {"model_sha256": sha.encode().decode("unicode_escape")} if sha else {}
    try:
        reply = fake.hello(node=node, **over)
    except OSError as e:
        reply = "error: %s" % e
    print("fake_peer: hello answered with %r" % (reply,))
    fake.close()
    return 0


def cmd_tail(addr, log, key=None, encrypt=False):
    layout = layout_from_log(log)
    fake = FakeDecode(addr, layout, key=key, encrypt=encrypt)
    reply = fake.hello()
    if not reply or reply.get("type") != "hello" or not fake.session:
        print("fake_peer: no handshake: %r" % (reply,))
        return 2
    fake.open_data()
    # one prompt token into a fake destination page: prefill computes
    # position 0 and ships the page; positions >= 1 must be zero
    fake.prefill_request(7, [1], [(3, 5)])
    hdr, entries, pages = fake.read_batch()
    done = fake.next_msg()
    fake.close()
    if done.get("type") != "prefill_done":
        print("fake_peer: expected prefill_done, got %r" % (done,))
        return 2
    if len(pages) != 1 or entries[0]["tokens"] != 1:
        print("fake_peer: expected one page of 1 token, got %r" % (entries,))
        return 2
    bad = stale_bytes(layout, pages[0], 1)
    for layer, kv, off in bad:
        print("fake_peer: stale bytes in layer %d %s at byte %d of the block" % (layer, kv, off))
    print("fake_peer: %d of %d blocks carry stale bytes" % (len(bad), 2 * layout["n_layer"]))
    return 1 if bad else 0


def cmd_badreq(addr, log, key=None, encrypt=False):
    """Requests that break prefill's admission checks, then a good one."""
    import json
    layout = layout_from_log(log)
    fake = FakeDecode(addr, layout, key=key, encrypt=encrypt)
    reply = fake.hello()
    if not reply or reply.get("type") != "hello" or not fake.session:
        print("fake_peer: no handshake: %r" % (reply,))
        return 2
    fake.open_data()
    pt = layout["page_tokens"]
    toks = list(range(1, pt + 5))            # two pages' worth
    two = [(3, 1), (4, 1)]
    cases = [
        ("pages_short", toks, two[:1], None),
        ("pages_long", toks, two + [(5, 1)], None),
        ("vocab", toks[:-1] + [99999], two, None),
        ("tenant_evil", toks, two, 'evil"\ntenant=root'),
        ("tenant_long", toks, two, "t" * 64),
        ("good", toks, two, "carol"),
    ]
    for i, (name, tokens, pages, tenant) in enumerate(cases):
        rid = 100 + i
        fake.prefill_request(rid, tokens, pages, tenant=tenant)
        got = {}
        if name == "good":
            n = 0
            while n < len(pages):
                hdr, entries, _ = fake.read_batch()
                n += hdr["n_entries"]
            got["pages_received"] = n
        m = fake.next_msg()
        got.update({k: v for k, v in m.items() if isinstance(v, (str, int, float))})
        if m.get("type") == "prefill_done":
            fake.send({"type": "release_ack", "id": rid})
        print(json.dumps({"case": name, "reply": got}), flush=True)
    fake.close()
    return 0


def reply_of(sock):
    """What prefill sent back before closing: [messages], then 'closed'."""
    got = []
    try:
        while len(got) < 4:
            got.append(recv_frame(sock))
    except (EOFError, OSError, ValueError, IndexError):
        got.append("closed")
    return got


def attempt(addr, frames, timeout=5.0):
    s = socket.create_connection(split_addr(addr), timeout=timeout)
    try:
        for f in frames:
            send_frame(s, f)
        return reply_of(s)
    finally:
        s.close()


def bare(reply, allowed):
    """Every message is a refused {type, reason} (or an allowed bare one)."""
    for m in reply:
        if m == "closed":
            continue
        if not isinstance(m, dict):
            return False
        if m.get("type") == "refused" and set(m) == {"type", "reason"}:
            continue
        if m.get("type") in allowed and set(m) <= {"type"} | allowed[m["type"]]:
            continue
        return False
    return reply[-1] == "closed"


def cmd_stranger(addr, log):
    import json
    layout = layout_from_log(log)
    hello = FakeDecode(addr, layout).hello_msg(node="stranger")
    nd = os.urandom(32).hex()
    cases = [
        ("plain_hello", [hello], {}),
        # the integrity suite is named before any key is used: another
        # one, or none, is refused with `suite`
        ("other_suite", [{"type": "auth_hello", "version": PROTO_VERSION, "nonce": nd,
                          "suite": "aes-256-gcm"}], {}),
        ("no_suite", [{"type": "auth_hello", "version": PROTO_VERSION, "nonce": nd}], {}),
        ("wrong_proof", [{"type": "auth_hello", "version": PROTO_VERSION, "nonce": nd,
                          "suite": SUITE},
                         {"type": "auth_proof", "proof": os.urandom(32).hex(),
                          "name": os.urandom(80).hex()}],
         {"auth_challenge": {"nonce", "suite"}}),
        ("hello_after_challenge", [{"type": "auth_hello", "version": PROTO_VERSION, "nonce": nd,
                          "suite": SUITE},
                                   hello], {"auth_challenge": {"nonce", "suite"}}),
        ("request_first", [{"type": "prefill_request", "id": 1, "tokens": [1],
                            "pages": [[0, 1]], "max_tokens": 1, "temperature": 0.0,
                            "top_k": 0, "top_p": 1.0, "seed": 0}], {}),
        ("forged_token", [{"type": "data", "token": os.urandom(32).hex()}], {}),
        ("old_session", [{"type": "data", "session": 1}], {}),
    ]
    bad = 0
    for name, frames, allowed in cases:
        reply = attempt(addr, frames)
        ok = bare(reply, allowed)
        bad += not ok
        print(json.dumps({"case": name, "bare": ok, "reply": reply}))
    return 1 if bad else 0


def cmd_tamper(addr, log, key, encrypt):
    """Prove the key, then send the sealed hello with its tag's last bit
    flipped: prefill must refuse the frame and close the link."""
    fake = FakeDecode(addr, layout_from_log(log), key=key, encrypt=encrypt)
    fake.connect()
    refused = fake.authenticate()
    if refused is not None:
        print("handshake refused: %r" % (refused,))
        return 1
    body = bytearray(fake.tx.seal(pack(fake.hello_msg()), 0))
    body[-1] ^= 0x01
    fake.ctl.sendall(struct.pack(">I", len(body)) + bytes(body))
    fake.ctl.settimeout(5.0)
    try:
        got = fake.ctl.recv(4096)
    except OSError as e:
        print("no close within 5 s: %s" % e)
        return 1
    if got:
        print("answered: %r" % got[:200])
        return 1
    print("closed=1")
    return 0


def cmd_relay(listen, target, seconds):
    """Copy bytes between each accepted connection and a new one to
    TARGET, both ways, for SECONDS."""
    import select
    import time
    host, port = split_addr(listen)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(16)
    pairs, n, up, down = {}, 0, 0, 0
    end = time.time() + seconds
    while time.time() < end:
        socks = [srv] + list(pairs)
        ready, _, _ = select.select(socks, [], [], 0.1)
        for r in ready:
            if r is srv:
                c, _ = srv.accept()
                try:
                    t = socket.create_connection(split_addr(target), timeout=2.0)
                except OSError:
                    c.close()
                    continue
                pairs[c], pairs[t] = t, c
                n += 1
                continue
            other = pairs.get(r)
            if other is None:
                continue
            try:
                b = r.recv(65536)
            except OSError:
                b = b""
            if b:
                try:
                    other.sendall(b)
                except OSError:
                    b = b""
            if not b:
                for x in (r, other):
                    pairs.pop(x, None)
                    x.close()
                continue
            if r.getsockname()[1] == port:
                up += len(b)
            else:
                down += len(b)
    srv.close()
    print("relayed=%d bytes_up=%d bytes_down=%d" % (n, up, down))
    return 0


def cmd_hijack(addr, seconds, log=None, key=None):
    """Data connections with guessed tokens; none may get a byte of KV.
    With LOG (and --key), the attacker first pairs as a decode itself and
    then sprays the neighbours of its own token (what a counter would
    have handed the next peer) besides random guesses."""
    import time
    guesses = []
    if log:
        fake = FakeDecode(addr, layout_from_log(log), key=key)
        reply = fake.hello()
        if reply and reply.get("type") == "hello" and fake.session:
            mine = int(fake.session, 16)
            guesses = [(mine + d) % (1 << 256) for d in range(-64, 65) if d]
        fake.close()
    end = time.time() + seconds
    tries = kv = refused = 0
    while time.time() < end:
        try:
            s = socket.create_connection(split_addr(addr), timeout=2.0)
        except OSError:
            time.sleep(0.01)
            continue
        tries += 1
        try:
            tok = ("%064x" % guesses[tries % len(guesses)]) if guesses and tries % 2 \
                else os.urandom(32).hex()
            send_frame(s, {"type": "data", "token": tok})
            s.settimeout(0.5)
            while True:
                n = struct.unpack(">I", recv_exact(s, 4))[0]
                body = recv_exact(s, n)
                m = unpack(body)[0] if n < 4096 else None
                if isinstance(m, dict) and m.get("type") == "refused":
                    refused += 1
                else:
                    kv += 4 + n
        except (EOFError, OSError, ValueError, IndexError):
            pass
        finally:
            s.close()
    print("tries=%d neighbours=%d refused=%d kv_bytes=%d" % (tries, len(guesses), refused, kv))
    return 0


def cmd_crowd(addr, n, seconds):
    """Open n connections that never say a word; report how many prefill
    closed at once (refused at accept) and how many within `seconds`."""
    import time
    socks, failed = [], 0
    for _ in range(n):
        try:
            socks.append(socket.create_connection(split_addr(addr), timeout=2.0))
        except OSError:
            failed += 1
    time.sleep(0.5)
    def closed_now():
        k = 0
        for s in socks:
            s.setblocking(False)
            try:
                k += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                k += 1
        return k
    early = closed_now()
    print("crowd=%d connect_failed=%d closed_at_once=%d" % (n, failed, early), flush=True)
    time.sleep(seconds)
    late = closed_now()
    print("closed_after=%d" % late, flush=True)
    for s in socks:
        s.close()
    return 0


def cmd_bigframes(addr, n, mib, seconds):
    """n connections, each announcing a 4 MiB frame and sending `mib` MiB of
    it, never finishing, before any proof: memory a stranger could make a
    node hold. Reports how many the node closed."""
    import time
    socks = []
    chunk = b"\0" * 65536
    for _ in range(n):
        try:
            s = socket.create_connection(split_addr(addr), timeout=2.0)
            s.sendall(struct.pack(">I", 4 << 20))
            s.setblocking(False)
            socks.append([s, 0])
        except OSError:
            pass
    end = time.time() + seconds
    want = mib << 20
    while time.time() < end:
        busy = False
        for e in socks:
            if e[1] >= want:
                continue
            try:
                e[1] += e[0].send(chunk)
                busy = True
            except BlockingIOError:
                pass
            except OSError:
                e[1] = want   # closed by the node
        if not busy:
            time.sleep(0.05)
    closed = 0
    for e in socks:
        try:
            closed += e[0].recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        e[0].close()
    print("conns=%d sent_mib=%.1f closed=%d" % (len(socks), sum(e[1] for e in socks) / 1048576.0, closed), flush=True)
    return 0


def cmd_rogue(listen, seconds, mode):
    """Listen where decode expects its prefill; we hold no key."""
    import time
    host, port = split_addr(listen)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(16)
    srv.settimeout(0.2)
    seen = []
    end = time.time() + seconds
    while time.time() < end:
        try:
            c, _ = srv.accept()
        except OSError:
            continue
        c.settimeout(2.0)
        try:
            while True:
                m = recv_frame(c)
                seen.append(m.get("type") if isinstance(m, dict) else "?")
                if m.get("type") == "auth_hello":
                    if mode == "plain":
                        # a complete, well-formed hello: only its place
                        # in the handshake is wrong
                        send_frame(c, {"type": "hello", "version": PROTO_VERSION,
                                       "role": "prefill", "node": "rogue",
                                       "model_sha256": "0" * 64, "kv_dtype": "f32",
                                       "page_tokens": 16, "n_layer": 2, "kv_dim": 32,
                                       "page_bytes": 8256, "pool_tokens": 1 << 20,
                                       "context": 1 << 20, "max_batch_bytes": 4 << 20,
                                       "checksum": True,
                                       "session": os.urandom(32).hex()})
                    elif mode == "suite":
                        # a challenge naming a weaker suite: decode must
                        # stop before it proves anything
                        send_frame(c, {"type": "auth_challenge", "nonce": os.urandom(32).hex(),
                                       "suite": "xxh3-unkeyed"})
                    else:
                        send_frame(c, {"type": "auth_challenge", "nonce": os.urandom(32).hex(),
                                       "suite": SUITE})
                elif m.get("type") == "auth_proof":
                    send_frame(c, {"type": "auth_proof", "proof": os.urandom(32).hex(),
                                   "name": os.urandom(80).hex()})
        except (EOFError, OSError, ValueError, IndexError):
            pass
        finally:
            c.close()
    srv.close()
    print("seen=" + ",".join(sorted(set(seen))) + " count=%d" % len(seen))
    return 0


def cmd_ackflood(listen, log, n, seconds):
    """A prefill that floods decode with unsolicited abort_acks."""
    import select
    import time
    layout = layout_from_log(log)
    host, port = split_addr(listen)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(4)
    srv.settimeout(seconds)
    ctl, _ = srv.accept()
    ctl.settimeout(5.0)
    h = recv_frame(ctl)
    if h.get("type") != "hello":
        print("handshake=failed first=%s" % h.get("type"), flush=True)
        return 2
    session = os.urandom(32).hex()
    hello = {"type": "hello", "version": PROTO_VERSION, "role": "prefill",
             "node": "ackflood", "pool_tokens": 1 << 20, "context": 1 << 20,
             "max_batch_bytes": 4 << 20, "checksum": True, "session": session}
    hello.update(layout)
    send_frame(ctl, hello)
    data, _ = srv.accept()
    data.settimeout(5.0)
    d = recv_frame(data)
    if d.get("type") != "data" or d.get("token") != session:
        print("handshake=failed data=%r" % (d,), flush=True)
        return 2
    send_frame(ctl, {"type": "data_bound"})
    end = time.time() + seconds
    rid, last_hb = None, 0.0

    def beat():
        nonlocal last_hb
        if time.time() - last_hb >= 0.1:
            send_frame(ctl, {"type": "heartbeat", "load": 0})
            last_hb = time.time()
    while rid is None and time.time() < end:
        beat()
        if not select.select([ctl], [], [], 0.05)[0]:
            continue
        m = recv_frame(ctl)
        if m.get("type") == "prefill_request":
            rid = m["id"]
    if rid is None:
        print("handshake=ok request=none", flush=True)
        return 2
    for i in range(n):
        send_frame(ctl, {"type": "abort_ack", "id": rid, "batches": 0})
        if i % 200 == 0:
            beat()
    send_frame(ctl, {"type": "prefill_reject", "id": rid, "code": "INTERNAL",
                     "message": "ackflood: done"})
    t1 = time.time() + 1.0   # stay up: the request ends on our reject
    while time.time() < t1:
        beat()
        if select.select([ctl], [], [], 0.05)[0]:
            try:
                recv_frame(ctl)
            except (EOFError, OSError, ValueError):
                break
    print("handshake=ok acks=%d id=%d" % (n, rid), flush=True)
    return 0


def cmd_mute(addr, log, key, conns, seconds, source):
    """A key holder that proves the key on CONNS connections from SOURCE
    and then never says its hello - it keeps talking (a frame it never
    finishes, one byte every 100 ms, so liveness does not close it) -
    reopening each one prefill closes, for SECONDS. Prints opened=
    proven= closed=."""
    import threading
    import time
    layout = layout_from_log(log)
    end = time.time() + seconds
    st = {"opened": 0, "proven": 0, "closed": 0}
    lock = threading.Lock()

    def one():
        while time.time() < end:
            fake = FakeDecode(addr, layout, key=key)
            try:
                fake.ctl = socket.create_connection(fake.addr, timeout=5,
                                                    source_address=(source, 0))
                with lock:
                    st["opened"] += 1
                if fake.authenticate() is not None:
                    raise OSError("refused")
                with lock:
                    st["proven"] += 1
                fake.ctl.sendall(b"\x00\x00\x00\xc8")
                fake.ctl.settimeout(0.1)
                while time.time() < end:
                    fake.ctl.send(b"\x00")
                    try:
                        if fake.ctl.recv(4096) == b"":
                            break
                    except socket.timeout:
                        pass
            except (OSError, EOFError, ValueError):
                pass
            finally:
                with lock:
                    st["closed"] += 1
                if fake.ctl is not None:
                    fake.ctl.close()
            time.sleep(0.01)

    th = [threading.Thread(target=one, daemon=True) for _ in range(conns)]
    for t in th:
        t.start()
    for t in th:
        t.join(seconds + 10)
    print("opened=%d proven=%d closed=%d" % (st["opened"], st["proven"], st["closed"]),
          flush=True)
    return 0


def cmd_caplines(log):
    """Print node and pool_tokens of every event=kv_capacity line."""
    with open(log, errors="replace") as f:
        for line in f:
            p = log_pairs(line)
            if p.get("event") == "kv_capacity":
                print(p.get("node", "-"), p.get("pool_tokens", "-"))
    return 0


def main(argv):
    key, encrypt = None, False
    while len(argv) > 2 and argv[1] in ("--key", "--encrypt"):
        if argv[1] == "--encrypt":
            encrypt, argv = True, argv[:1] + argv[2:]
            continue
        with open(argv[2], "rb") as f:
            key = f.read()
        argv = argv[:1] + argv[3:]
    if len(argv) == 4 and argv[1] == "tail":
        return cmd_tail(argv[2], argv[3], key, encrypt)
    if len(argv) == 4 and argv[1] == "badreq":
        return cmd_badreq(argv[2], argv[3], key, encrypt)
    if len(argv) == 4 and argv[1] == "stranger":
        return cmd_stranger(argv[2], argv[3])
    if len(argv) in (4, 5) and argv[1] == "hijack":
        return cmd_hijack(argv[2], float(argv[3]), argv[4] if len(argv) > 4 else None, key)
    if len(argv) == 6 and argv[1] == "bigframes":
        return cmd_bigframes(argv[2], int(argv[3]), int(argv[4]), float(argv[5]))
    if len(argv) == 5 and argv[1] == "crowd":
        return cmd_crowd(argv[2], int(argv[3]), float(argv[4]))
    if len(argv) == 5 and argv[1] == "rogue":
        return cmd_rogue(argv[2], float(argv[3]), argv[4])
    if len(argv) == 6 and argv[1] == "ackflood":
        return cmd_ackflood(argv[2], argv[3], int(argv[4]), float(argv[5]))
    if len(argv) == 4 and argv[1] == "tamper" and key is not None:
        return cmd_tamper(argv[2], argv[3], key, encrypt)
    if len(argv) == 5 and argv[1] == "relay":
        return cmd_relay(argv[2], argv[3], float(argv[4]))
    if len(argv) == 7 and argv[1] == "mute" and key is not None:
        return cmd_mute(argv[2], argv[3], key, int(argv[4]), float(argv[5]), argv[6])
    if len(argv) == 3 and argv[1] == "caplines":
        return cmd_caplines(argv[2])
    if len(argv) in (5, 6) and argv[1] == "hello":
        return cmd_hello(argv[2], argv[3], argv[4], argv[5] if len(argv) > 5 else None)
    sys.stderr.write(__doc__)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
