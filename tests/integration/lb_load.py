#!/usr/bin/env python3
"""lb_load.py - streaming clients for the load balancer tests
(haproxy_lb.sh, rolling_restart.sh, kill_nodes.sh).

  lb_load.py load URL OUT STOPFILE --keys K1,K2,... [--max-tokens N] [--think-ms M]
                  [--prompt-repeat R]
      One closed-loop client per key (a thread each): a streaming
      /v1/completions request, read to its end, the next one, until
      STOPFILE exists. One JSON line per request in OUT: key, t0 (epoch
      seconds), ttft (s, to the first SSE event; null if none), t_end,
      events, outcome, detail. outcome is
        ok           200, text/event-stream, a finish_reason and [DONE]
        status       an HTTP error status before any event (detail: it)
        cut          200 and events, then the connection ended before
                     [DONE] (detail: what ended it)
        error_event  an SSE error event
        conn         no answer: the connection failed or closed first
  lb_load.py stats OUT [--from T] [--to T] [--exclude T1:T2,...]
      Counts per outcome and TTFT p50/p99 (ms) of the ok requests that
      began in [from, to), minus those that began in an excluded window,
      as one JSON object.
  lb_load.py sse URL KEY MAX_TOKENS
      One streaming request; prints {status, events, done, first, last,
      span, distinct}: arrival times (s after the request) of the first
      and last event, and how many distinct 5 ms slots events arrived in
      (a proxy that buffers the stream delivers them all at once).
"""
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

PROMPT = "Once upon a time there was a"


def body(key_idx, max_tokens, repeat=1):
    # a different prompt per client, so clients share no prefix
    return json.dumps({"prompt": "%d %s" % (key_idx, " ".join([PROMPT] * repeat)),
                       "max_tokens": max_tokens, "stream": True, "temperature": 0.8}).encode()


def one(url, key, payload, on_event=None):
    """One streaming request. Returns (outcome, detail, t_first, events)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    t_first = None
    events = 0
    try:
        conn.request("POST", "/v1/completions", body=payload,
                     headers={"Authorization": "Bearer " + key,
                              "Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return "status", "%d %s" % (resp.status, resp.read(300)[:300].decode("utf-8", "replace")), None, 0
        ctype = resp.getheader("Content-Type", "")
        if not ctype.startswith("text/event-stream"):
            return "status", "200 but Content-Type %s" % ctype, None, 0
        finish = None
        while True:
            try:
                line = resp.readline()
            except (http.client.IncompleteRead, ConnectionError, OSError) as e:
                return "cut", "read: %s" % type(e).__name__, t_first, events
            if not line:
                return ("cut" if events else "conn"), "closed before [DONE]", t_first, events
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            now = time.time()
            if t_first is None:
                t_first = now
            events += 1
            if on_event:
                on_event(now)
            if data == b"[DONE]":
                if finish is None:
                    return "cut", "[DONE] without a finish_reason", t_first, events
                return "ok", finish, t_first, events
            try:
                ev = json.loads(data)
            except ValueError:
                return "cut", "unparsable event %r" % data[:100], t_first, events
            if "error" in ev:
                return "error_event", json.dumps(ev["error"])[:300], t_first, events
            for c in ev.get("choices") or []:
                if c.get("finish_reason"):
                    finish = c["finish_reason"]
    except (ConnectionError, OSError, http.client.HTTPException) as e:
        return ("cut" if events else "conn"), "%s: %s" % (type(e).__name__, e), t_first, events
    finally:
        conn.close()


def client(url, out, lock, stop, idx, key, max_tokens, think, repeat):
    payload = body(idx, max_tokens, repeat)
    while not os.path.exists(stop):
        t0 = time.time()
        outcome, detail, t_first, events = one(url, key, payload)
        rec = {"key": idx, "t0": t0, "ttft": (t_first - t0) if t_first else None,
               "t_end": time.time(), "events": events, "outcome": outcome, "detail": detail}
        with lock:
            out.write(json.dumps(rec) + "\n")
            out.flush()
        if think:
            time.sleep(think)


def cmd_load(argv):
    url, path, stop = argv[0], argv[1], argv[2]
    opts = dict(zip(argv[3::2], argv[4::2]))
    keys = opts["--keys"].split(",")
    max_tokens = int(opts.get("--max-tokens", "48"))
    think = int(opts.get("--think-ms", "0")) / 1000.0
    repeat = int(opts.get("--prompt-repeat", "1"))
    lock = threading.Lock()
    with open(path, "a") as out:
        ts = [threading.Thread(target=client, args=(url, out, lock, stop, i, k, max_tokens, think, repeat))
              for i, k in enumerate(keys)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return round(xs[i] * 1000.0, 1)


def cmd_stats(argv):
    path = argv[0]
    opts = dict(zip(argv[1::2], argv[2::2]))
    lo = float(opts.get("--from", "0"))
    hi = float(opts.get("--to", "1e18"))
    excl = [tuple(map(float, w.split(":"))) for w in opts.get("--exclude", "").split(",") if w]
    counts, ttft, bad = {}, [], []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if not lo <= r["t0"] < hi or any(a <= r["t0"] < b for a, b in excl):
                continue
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
            if r["outcome"] == "ok":
                ttft.append(r["ttft"])
            elif len(bad) < 5:
                bad.append(r["outcome"] + ": " + r["detail"])
    print(json.dumps({"n": sum(counts.values()), "ok": counts.get("ok", 0), "outcomes": counts,
                      "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99), "failures": bad}))


def cmd_sse(argv):
    url, key, max_tokens = argv[0], argv[1], int(argv[2])
    times = []
    t0 = time.time()
    outcome, detail, _, events = one(url, key, body(0, max_tokens), times.append)
    rel = [t - t0 for t in times]
    print(json.dumps({"outcome": outcome, "detail": detail, "events": events,
                      "first": rel[0] if rel else None, "last": rel[-1] if rel else None,
                      "span": (rel[-1] - rel[0]) if rel else 0,
                      "distinct": len({int(t / 0.005) for t in rel})}))


if __name__ == "__main__":
    cmds = {"load": cmd_load, "stats": cmd_stats, "sse": cmd_sse}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](sys.argv[2:])
