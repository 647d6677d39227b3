#!/usr/bin/env python3
"""Writes lua/conformance/vectors/*.json: runs the calls below on a private redis-server (the
scripts of lua/, the clock set as lua/conformance/README.md says) and writes each reply as the
expectation. Run by a maintainer when the contract changes on purpose, then read the diff: every
changed reply is a change of the contract. The checks marked `check=` are what the contract
promises (lua/README.md), asserted while recording, so a wrong script is not written down as
right.

  lua/conformance/record.py           write the vectors (needs redis-server and redis-py)
  lua/conformance/record.py --check   change nothing; exit 1 if a file would change
"""
from __future__ import annotations

import json
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import redis

HERE = pathlib.Path(__file__).resolve().parent
LUA = HERE.parent
T0 = 4102444800000  # 2100-01-01T00:00:00Z: the scripts' expiries lie in the future
W = 60000
POLICY = ["0.2", "10", "s", "sliding"]


def key(dep: str) -> str:
    return "$P:v1:{" + dep + "}"


def clocked(name: str, now_ms: int) -> str:
    text = (LUA / f"{name}.lua").read_text(encoding="utf-8")
    assert text.count("redis.call('TIME')") == 1, name
    return text.replace("redis.call('TIME')", "{'%d', '%d'}" % (now_ms // 1000, now_ms % 1000 * 1000))


def to_json(v):
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, list):
        return [to_json(x) for x in v]
    return v


class Step(dict):
    """A step, with an optional check of its reply (not written to the vector)."""

    def __init__(self, check=None, **kw):
        super().__init__(**kw)
        self.check = check


def call(script, keys, args, now, check=None):
    return Step(check=check, script=script, keys=keys, args=[str(a) for a in args], now_ms=now)


def spend(dep, now, window=W, policy=POLICY, memory=(), check=None):
    return call("spend", [key(dep)], [window, *policy, *memory], now, check)


def spend_many(dep, n, now, window=W, policy=POLICY, check=None):
    return call("spend_many", [key(dep)], [window, n, *policy], now, check)


def deposit(dep, s, a, now, window=W, policy=POLICY, denied=None, memory=(), check=None):
    extra = [] if denied is None else [denied]
    return call("deposit", [key(dep)], [window, s, a, *policy, *extra, *memory], now, check)


def status(dep, now, window=W, policy=POLICY, check=None):
    return call("status", [key(dep)], [window, *policy], now, check)


def cmd(*words, check=None):
    return Step(check=check, redis=[str(w) for w in words])


def granted(g):
    return lambda r: r[0] == g


def field(n, v):
    """Reply field n (1-based, as lua/README.md numbers them) equals v."""
    return lambda r: r[n - 1] == v


def both(*checks):
    return lambda r: all(c(r) for c in checks)


def errors(text):
    return lambda r: isinstance(r, Exception) and str(r).startswith(text)


def v(name, about, steps):
    return {"name": name, "about": about, "steps": steps}


# ---------------------------------------------------------------------------------------------
def decision():
    t = T0 + 1000
    steps = [spend("search", t, check=both(granted(1), field(2, 10))) for _ in range(10)]
    steps[-1].check = both(granted(1), field(9, 10))
    steps += [
        spend("search", t, check=both(granted(0), field(10, 1))),
        # 100 successes: allowance max(10, floor(0.2 x 100)) = 20, so 10 more, not 20.
        deposit("search", 100, 0, t + 1, check=field(2, 20)),
    ]
    steps += [spend("search", t + 2, check=granted(1)) for _ in range(10)]
    steps += [spend("search", t + 2, check=both(granted(0), field(9, 20))), status("search", t + 3),
              # Half-way through the next window: 100 successes and 20 retries count half.
              spend("search", T0 + W + W // 2, check=both(granted(0), field(2, 10), field(13, 20)))]
    worked = v("worked example: floor 10, then 100 successes give 10 more, not 20",
               "lua/README.md's worked example. The allowance is max(floor, ratio x deposits), never "
               "their sum: 10 retries on the floor, then 100 successes at ratio 0.2 raise the allowance "
               "to 20, of which 10 are spent already.", steps)

    half = T0 + W + W // 2
    roll = v("sliding window: the previous window weighs what is left of it",
             "Deposits and retries of the window before count with weight (W - elapsed) / W. A jump "
             "of two windows clears both; an index lower than stored (a server whose clock is behind) "
             "keeps the stored window.",
             [deposit("roll", 200, 0, T0 + 10, check=field(2, 40)),
              spend_many("roll", 30, T0 + 20, check=granted(30)),
              # Half-way through the next window: deposits 200 x 1/2 -> allowance 20; retries 30 x 1/2 = 15.
              spend("roll", half, check=both(field(2, 20), field(6, W // 2), granted(1))),
              spend_many("roll", 10, half, check=granted(4)),
              status("roll", half + 1),
              # Back in time by a window: the stored window stays.
              spend("roll", half - W, check=field(3, (half) // W)),
              # Two windows later: both cleared, the floor again.
              spend("roll", half + 2 * W, check=both(field(2, 10), field(9, 1), field(13, 0))),
              cmd("HGETALL", key("roll")),
              cmd("PEXPIRETIME", key("roll"))])

    fixed = v("fixed mode and deposits of first attempts",
              "Mode fixed gives the previous window no weight; basis a counts first attempts, not successes.",
              [deposit("fx", 100, 500, T0 + 5, policy=["0.1", "0", "a", "fixed"], check=field(2, 50)),
               spend_many("fx", 60, T0 + 6, policy=["0.1", "0", "a", "fixed"], check=granted(50)),
               spend("fx", T0 + W + 1, policy=["0.1", "0", "a", "fixed"],
                     check=both(granted(0), field(2, 0), field(6, 0))),
               spend("fx0", T0 + 7, policy=["0", "0", "s", "sliding"], check=both(granted(0), field(18, -1)))])

    missing = v("status of a missing key",
                "status.lua writes nothing: a missing key reads as the reader's policy at its floor, PTTL -2, "
                "no conflict (-1 for the age), and it still does not exist afterwards.",
                [status("nothing", T0 + 9, check=both(field(2, 10), field(22, -2), field(25, -1))),
                 cmd("EXISTS", key("nothing"), check=lambda r: r == 0)])

    return {"about": "The decision: the floor, deposits, the sliding and fixed windows, rolls, status.",
            "vectors": [worked, roll, fixed, missing]}


def policies():
    a = POLICY
    b = ["0.5", "3", "s", "sliding"]
    conflict = v("policy conflict: the policy in force decides, the other caller is counted",
                 "A caller sending another policy is served by the one in force (fields 18 to 21 then carry "
                 "it), counted in xn/xp/xt (status fields 23 to 25), and keeps sending its own. Its policy "
                 "takes over only when nobody sent the one in force for a whole window of its own.",
                 [spend("pc", T0 + 100, policy=a, check=both(granted(1), field(15, 0))),
                  spend("pc", T0 + 200, policy=b, check=both(field(15, 1), field(2, 10), field(18, b"0.2"))),
                  spend("pc", T0 + 300, window=30000, policy=a, check=field(15, 1)),
                  status("pc", T0 + 400, policy=b, check=both(field(23, 2), field(15, 1))),
                  cmd("HMGET", key("pc"), "w", "r", "m", "b", "o", "h", "xn", "xp", "xt"),
                  # Deposits of the other policy count as conflicts too, and refresh nothing.
                  deposit("pc", 1, 0, T0 + 500, policy=b, check=field(15, 1)),
                  # The policy in force was last heard at T0+100: a window later, b takes over.
                  spend("pc", T0 + 100 + W, policy=b, check=both(field(15, 0), field(2, 3))),
                  status("pc", T0 + 101 + W, policy=a),
                  cmd("HMGET", key("pc"), "w", "r", "m", "b", "o", "h", "xn")])

    install = v("a deposit installs its policy on a new key",
                "deposit.lua's policy arguments do more than shape the reply: on a new key they install the "
                "policy in force and its last-heard time; a later caller of another policy is a conflict.",
                [deposit("di", 5, 5, T0 + 10, policy=b),
                 cmd("HMGET", key("di"), "w", "r", "m", "b", "o", "h", "e"),
                 spend("di", T0 + 20, policy=a, check=both(field(15, 1), field(18, b"0.5")))])

    numbers = v("policies are compared as numbers; the text in force is kept",
                "0.2, 0.20 and 2e-1 are one ratio, 6e4 and 60000 one window: no conflict. The stored ratio "
                "text stays the first caller's (status shows it).",
                [spend("num", T0 + 10, check=field(15, 0)),
                 spend("num", T0 + 11, policy=["0.20", "10", "s", "sliding"], check=field(15, 0)),
                 spend("num", T0 + 12, window="6e4", policy=["2e-1", "1e1", "s", "sliding"], check=field(15, 0)),
                 spend("num", T0 + 13, window="60000.0", check=field(15, 0)),
                 status("num", T0 + 14, policy=["2e-1", "10", "s", "sliding"]),
                 cmd("HMGET", key("num"), "w", "r", "m")])

    resize = v("a new window length carries the counters over",
               "When the policy in force's window changes, retries and denials of both windows are kept in "
               "the new current window; deposits only the current window's, scaled down to a shorter window.",
               [deposit("rs", 100, 0, T0 + 10),
                spend_many("rs", 25, T0 + 20, check=granted(20)),
                spend("rs", T0 + 20 + W, window=30000, check=field(15, 0)),
                cmd("HMGET", key("rs"), "w", "i", "cs", "cr", "cd", "ps", "pr", "pd")])

    return {"about": "The policy in force: conflicts, who installs it, when it changes, how it is compared.",
            "vectors": [conflict, install, numbers, resize]}


def arguments():
    t = T0 + 50
    ok, bad = [], []
    # Accepted forms and bounds.
    for w in ["6e4", "60000.0", " 60000", "0xEA60", "86400000", "1"]:
        ok.append(spend("w" + str(len(ok)), t, window=w))
    for r in ["10", "0", "1e-7", "0.0000001", "1.0", "0." + "1" * 30]:
        ok.append(spend("r" + str(len(ok)), t, policy=[r, "10", "s", "sliding"]))
    ok.append(spend("m", t, policy=["0.2", "1000000000", "s", "fixed"]))
    ok.append(spend_many("n", 10000, t, check=granted(10)))
    ok.append(deposit("d", "999999999999999", "0", t))
    ok.append(deposit("d2", "0", "0", t, denied="999999999999999"))
    ok.append(spend("extra", t, memory=["", "0,0,,,0,0,0,0,0,0,0,0,0,0", "ignored", "too"]))
    # Refused, each naming the first bad argument; nothing written.
    for w in ["0", "1.5", "-1", "86400001", "inf", "nan", "1e300", ""]:
        bad.append(spend("bad", t, window=w, check=errors("fleet-budget: ARGV[1] window_ms")))
    for r in ["-0.1", "10.000001", "nan", "inf", "0." + "1" * 31, "", "abc"]:
        bad.append(spend("bad", t, policy=[r, "10", "s", "sliding"], check=errors("fleet-budget: ARGV[2] ratio")))
    for m in ["-1", "1.5", "1000000001", ""]:
        bad.append(spend("bad", t, policy=["0.2", m, "s", "sliding"], check=errors("fleet-budget: ARGV[3]")))
    bad.append(spend("bad", t, policy=["0.2", "10", "S", "sliding"], check=errors("fleet-budget: ARGV[4]")))
    bad.append(spend("bad", t, policy=["0.2", "10", "s", "slide"], check=errors("fleet-budget: ARGV[5]")))
    bad.append(spend("bad", t, window="0", policy=["x", "y", "z", "w"], check=errors("fleet-budget: ARGV[1]")))
    for n in ["0", "10001", "1e3", "1.0", " 5", "-1"]:
        bad.append(spend_many("bad", n, t, check=errors("fleet-budget: ARGV[2] n")))
    ok.append(deposit("big", "999999999999999", "999999999999999", t))
    for s in ["1000000000000000", "-1", "1.0", "1e3"]:
        bad.append(deposit("bad", s, "0", t, check=errors("fleet-budget: ARGV[2]")))
    bad.append(deposit("bad", "0", "x", t, check=errors("fleet-budget: ARGV[3]")))
    bad.append(deposit("bad", "0", "0", t, denied="-1", check=errors("fleet-budget: ARGV[8]")))
    bad.append(spend("bad", t, memory=["x", ""], check=errors("fleet-budget: ARGV[6]")))
    ok.append(spend("nomem", t, memory=["", "1,2"]))
    bad.append(spend("bad", t, memory=["123", "1,2"], check=errors("fleet-budget: ARGV[7]")))
    bad.append(status("bad", t, policy=["0.2", "10", "s", "both"], check=errors("fleet-budget: ARGV[5]")))
    bad.append(cmd("EXISTS", key("bad"), check=lambda r: r == 0))
    missing = lambda text: errors(f"fleet-budget: {text} is missing")
    nokey = [call("spend", [], [W, *POLICY], t, check=missing("KEYS[1] budget hash")),
             call("deposit", [], [W, 1, 0, *POLICY], t, check=missing("KEYS[1] budget hash")),
             call("status", [], [W, *POLICY], t, check=missing("KEYS[1] budget hash")),
             call("breaker", [], ["admit"], t, check=missing("KEYS[1] breaker hash")),
             call("lease_acquire", [key("l") + ":lp"], ["p", "id", 10, 1000, 0], t,
                  check=missing("KEYS[2] retry lease set")),
             call("heartbeat", [], ["beat", "w1", "{}", W], t, check=missing("KEYS[1] worker reports hash")),
             Step(check=missing("KEYS[1] dead-letter index"), script="dead_letters", keys=[], args=["10", "x", "1"]),
             cmd("SET", key("str"), "x"),
             spend("str", t, check=errors("fleet-budget: key")),
             status("str", t, check=errors("fleet-budget: key")),
             cmd("HSET", key("tampered"), "w", "60000", "i", "x", "cr", "1"),
             spend("tampered", t, check=errors("fleet-budget: key")),
             cmd("HGETALL", key("tampered"))]
    return {"about": "The arguments: the forms accepted, the ranges, and the errors that name them.",
            "vectors": [
                v("accepted forms and bounds",
                  "What the scripts take: numbers as Lua's tonumber reads them (6e4, 60000.0, a leading "
                  "space) where a number is asked, plain digits where a count is; each bound itself. "
                  "Arguments past the last one a script reads are ignored.", ok),
                v("refused arguments name the first bad one and write nothing",
                  "Each error starts 'fleet-budget: ARGV[k] <name>'. An error is not a denial: the call "
                  "was not decided, and sending it again gets the same error.", bad),
                v("a missing key, a key of another type, a tampered field",
                  "A call without the keys a script needs gets an error naming the first missing one (KEYS[k] and "
                  "what it is); a key of another type or a field that is not a number is named, and nothing is written.", nokey)]}


def batches():
    many = v("spend_many decides n as n spends in a row would",
             "It grants a prefix: g of n (field 1), counting the rest as denials.",
             [spend_many("sm", 7, T0 + 1, check=granted(7)),
              spend_many("sm", 7, T0 + 2, check=both(granted(3), field(10, 4))),
              spend_many("sm", 1, T0 + 3, policy=["0.5", "10", "s", "sliding"], check=field(15, 1)),
              status("sm", T0 + 4, check=field(23, 1))])
    b = [
        call("spend_batch", [key("b1"), key("b2"), key("b1")],
             [W, 8, *POLICY, W, 2, "0.5", "1", "a", "fixed", W, 5, *POLICY], T0 + 10),
        call("spend_batch", [key("b1"), key("b3")], [W, 1, *POLICY, "0", 1, *POLICY], T0 + 11,
             check=lambda r: isinstance(r[1], bytes) and r[1].startswith(b"fleet-budget: ARGV[1]")),
        cmd("EXISTS", key("b3"), check=lambda r: r == 0),
        call("spend_batch", [key("b1")], [W, 1, *POLICY, "extra"], T0 + 12, check=errors("fleet-budget: spend_batch")),
        call("spend_batch", [], [], T0 + 12, check=errors("fleet-budget: spend_batch")),
        call("spend_batch", [key("b1"), key("b2")], [W, 6000, *POLICY, W, 5000, *POLICY], T0 + 12,
             check=errors("fleet-budget: spend_batch")),
    ]
    batch = v("spend_batch: entries in order, one instant, errors per entry",
              "Entry j is decided as its spend_many would be; a key in two entries sees the first's counts; "
              "an entry's bad argument comes back as its error text (a string) and the others are decided; "
              "a malformed call as a whole is an error.", b)
    return {"about": "Deciding several requests in one call.", "vectors": [many, batch]}


def overrides():
    t = T0 + 1000
    steps = [
        spend("ov", t),
        call("override", [key("ov")], ["freeze", 30000, "ops", "incident 12"], t + 1),
        spend("ov", t + 2, check=both(granted(0), field(16, 1), field(18, 29999))),
        cmd("PEXPIRETIME", key("ov"), check=lambda r: r == -1),
        deposit("ov", 1000, 0, t + 3, check=field(16, 1)),
        status("ov", t + 4, check=both(field(2, 0), field(22, -1))),
        call("override", [key("ov")], ["set", 60000, "ops", "more", "", "50"], t + 5),
        call("override", [key("ov")], ["unfreeze"], t + 6),
        spend("ov", t + 7, check=both(granted(1), field(17, 1), field(2, 200))),
        status("ov", t + 8, check=field(27, 50)),
        call("override", [key("ov")], ["clear"], t + 9),
        spend("ov", t + 10, check=both(field(17, 0), field(2, 200))),
        cmd("PEXPIRETIME", key("ov")),
        spend("ov2", t),
        call("override", [key("ov2")], ["freeze", 500, "ops", "short"], t),
        spend("ov2", t + 500, check=both(granted(1), field(16, 0))),
        call("override", [key("ov2")], ["freeze", 0, "ops", "x"], t, check=errors("fleet-budget: ARGV[2]")),
        call("override", [key("ov2")], ["set", 1000, "ops", "x", "1001", ""], t, check=errors("fleet-budget: ARGV[5]")),
    ]
    return {"about": "Operators' overrides (override.lua) as the worker scripts see them.",
            "vectors": [v("freeze, set, unfreeze, clear",
                          "A freeze grants nothing, the floor included (field 16), and the key has no expiry while "
                          "it is in force; a set override replaces the floor and/or ratio (field 17, status 26-27); "
                          "both end by themselves.", steps)]}


def lost():
    t = T0 + 1000
    mem_before = None  # filled from replies at record time: see remember()
    steps = [
        spend("lo", t, memory=["", ""]),
        call("override", [key("lo")], ["freeze", 60000, "ops", "x"], t + 1),
        spend("lo", t + 2, memory=["REMEMBER", "REMEMBER"]),
        cmd("DEL", key("lo")),
        spend("lo", t + 3, memory=["REMEMBER", "REMEMBER"], check=both(granted(0), field(16, 1))),
        cmd("HMGET", key("lo"), "fu", "fa", "cr", "cd"),
        spend("lo", t + 4, memory=["REMEMBER", "REMEMBER"]),
    ]
    return {"about": "Lost budgets: the caller's memory restores what still counts.",
            "vectors": [v("a hash lost under a freeze comes back from a worker's memory",
                          "A caller sends the birth and state it last saw (ARGV 6-7 of spend); the hash deleted "
                          "behind its back is restored before deciding: the freeze holds, lost = 1.", steps)],
            "_remember": True}


def leases_and_more():
    t = T0 + 1000
    lp, lr = "$P:v1:{ls}:lp", "$P:v1:{ls}:lr"
    lease = [
        call("lease_acquire", [lp, lr], ["p", "a1", 5000, 3, "0.5", 1, 0], t),
        call("lease_acquire", [lp, lr], ["r", "b1", 5000, 3, "0.5", 1, 0], t),
        call("lease_acquire", [lp, lr], ["r", "b2", 5000, 3, "0.5", 1, 0], t, check=lambda r: r[0] == 0 and r[1] == 2),
        call("lease_acquire", [lp, lr], ["p", "a2", 5000, 3, "0.5", 1, 1], t),
        call("lease_acquire", [lp, lr], ["p", "a3", 5000, 3, "0.5", 1, 1], t, check=lambda r: r[0] == 0 and r[1] == 1),
        call("lease_release", [lp, lr], ["b1"], t + 1),
        call("lease_acquire", [lp, lr], ["r", "b2", 5000, 3, "0.5", 1, 0], t + 5000),
        call("lease_acquire", [lp, lr], ["x", "b2", 5000, 3, "0.5", 1, 0], t, check=errors("fleet-budget:")),
    ]
    cb = "$P:v1:{br}:cb"
    cfg = [W, "0.5", 4, 1000, 1, 1, 5000]
    breaker = [
        call("breaker", [cb], ["record", *cfg, "f", 0], t),
        call("breaker", [cb], ["record", *cfg, "f", 0], t),
        call("breaker", [cb], ["record", *cfg, "s", 0], t),
        call("breaker", [cb], ["record", *cfg, "f", 0], t + 1),
        call("breaker", [cb], ["admit", *cfg], t + 2),
        call("breaker", [cb], ["admit", *cfg], t + 1001),
        call("breaker", [cb], ["record", *cfg, "s", 2], t + 1002),
        call("breaker", [cb], ["status", *cfg], t + 1003),
    ]
    reg = ["$P:v1:workers:{workers}", "$P:v1:workers:{workers}:seen"]
    heartbeat = [
        call("heartbeat", reg, ["beat", "w1", '{"v":1}', 60000], t),
        call("heartbeat", reg, ["beat", "w2", '{"v":1}', 60000], t + 1),
        call("heartbeat", reg, ["beat", "w2", '{"v":1}', 60000], t + 70000),
        call("heartbeat", reg, ["leave", "w2"], t + 70001),
        call("heartbeat", reg, ["beat", "", "x", 60000], t, check=errors("fleet-budget: ARGV[2]")),
    ]
    idx = "$P:v1:dead-letters:{q}"
    row = '["search","budget_exhausted","Timeout","t","ex",0,1]'
    dead = [
        Step(script="dead_letters", keys=[idx], args=["2", row, "3", '["a"]', "1"]),
        Step(script="dead_letters", keys=[idx], args=["2", '["b"]', "2", row, "-5"]),
        cmd("HGETALL", idx),
        Step(script="dead_letters", keys=[idx], args=["2", row, "0"], check=errors("fleet-budget: ARGV[3]")),
    ]
    return {"about": "The other scripts: concurrency leases, the circuit breaker, the worker registry, the "
                     "dead-letter index.",
            "vectors": [v("leases: the retry share and the cap", "lease_acquire / lease_release.", lease),
                        v("breaker: opens on failures, half-opens, closes on a probe", "breaker.lua.", breaker),
                        v("worker registry: beats, pruning, leave", "heartbeat.lua.", heartbeat),
                        v("dead-letter index: bounded rows, never below 0", "dead_letters.lua.", dead)]}


FILES = {"decision": decision, "policy": policies, "arguments": arguments, "batch": batches,
         "overrides": overrides, "lost": lost, "other_scripts": leases_and_more}


class Raw:
    """Replies as the server sends them (redis-py's callbacks would turn HGETALL into a dict)."""

    def __init__(self, conn):
        self.conn = conn

    def execute_command(self, *args):
        self.conn.send_command(*args)
        reply = self.conn.read_response()
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
        return reply

    def eval(self, text, nkeys, *args):
        return self.execute_command("EVAL", text, nkeys, *args)

    def keys(self, pattern):
        return self.execute_command("KEYS", pattern)

    def delete(self, *keys):
        return self.execute_command("DEL", *keys)


def start_server(tmp: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
                             "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port, socket_timeout=5, protocol=2)
    for _ in range(500):
        try:
            r.ping()
            return proc, Raw(r.connection_pool.get_connection())
        except redis.exceptions.ConnectionError:
            time.sleep(0.01)
    proc.kill()
    raise SystemExit("redis-server did not start")


def subst(x, prefix):
    if isinstance(x, str):
        return x.replace("$P", prefix)
    return [subst(y, prefix) for y in x]


def record(r, name, spec):
    out = {"format": 1, "about": spec["about"], "vectors": []}
    for vi, vec in enumerate(spec["vectors"]):
        prefix = f"rec-{name}-{vi}"
        memory = None  # for lost.json: the birth and state of the last reply with memory fields
        steps = []
        for si, step in enumerate(vec["steps"]):
            s = {k: v for k, v in step.items()}
            if "script" in s and s.get("args") and "REMEMBER" in s["args"]:
                birth, state = memory
                s["args"] = [a for a in s["args"] if a != "REMEMBER"] + [birth, state]
            try:
                if "script" in s:
                    text = (LUA / f"{s['script']}.lua").read_text(encoding="utf-8")
                    if "now_ms" in s:
                        text = clocked(s["script"], s["now_ms"])
                    reply = r.eval(text, len(s["keys"]), *subst(s["keys"], prefix), *subst(s["args"], prefix))
                else:
                    reply = r.execute_command(*subst(s["redis"], prefix))
            except redis.exceptions.ResponseError as e:
                reply = e
            if step.check is not None and not step.check(reply):
                raise SystemExit(f"{name}: vector {vec['name']!r} step {si}: the contract's check failed on {reply!r}")
            if isinstance(reply, Exception):
                text = str(reply).replace(prefix, "$P")
                cut = text.find(" script: ")
                if cut >= 0:
                    s["error_prefix"] = text[:cut]
                else:
                    s["error"] = text
            else:
                s["reply"] = to_json(reply)
                if isinstance(s["reply"], str):
                    s["reply"] = s["reply"].replace(prefix, "$P")
                elif isinstance(s["reply"], list):
                    s["reply"] = [x.replace(prefix, "$P") if isinstance(x, str) else x for x in s["reply"]]
                if s.get("script") == "status" and s["reply"][21] >= 0:
                    s["reply"][21] = {"any_integer": True}
                if s.get("script") in ("spend", "spend_many", "deposit") and len(s["args"]) >= 2:
                    m = s["reply"]
                    at = {"spend": 6, "spend_many": 7, "deposit": 9}[s["script"]]
                    if len(s["args"]) >= at and len(m) >= 23:
                        last = m[-6:]
                        fields = m[:-6]
                        cnt = fields[6:14]
                        birth = str(last[0])
                        state = ",".join(str(x) for x in [last[1], last[2], last[3], last[4], fields[3], fields[2], *cnt])
                        memory = (birth, state)
            steps.append(s)
        out["vectors"].append({"name": vec["name"], "about": vec["about"], "steps": steps})
        keys = r.keys(f"{prefix}*")
        if keys:
            r.delete(*keys)
    return dump(out)


def dump(doc) -> str:
    """One step a line, so that a diff shows which reply changed."""
    j = lambda x: json.dumps(x, ensure_ascii=False)
    vectors = []
    for vec in doc["vectors"]:
        steps = ",\n".join("    " + j(s) for s in vec["steps"])
        vectors.append('  {"name": %s,\n   "about": %s,\n   "steps": [\n%s\n   ]}' % (j(vec["name"]), j(vec["about"]), steps))
    return '{"format": 1,\n "about": %s,\n "vectors": [\n%s\n ]}\n' % (j(doc["about"]), ",\n".join(vectors))


def main() -> int:
    check = "--check" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        proc, r = start_server(tmp)
        try:
            stale = []
            (HERE / "vectors").mkdir(exist_ok=True)
            for name, make in FILES.items():
                text = record(r, name, make())
                path = HERE / "vectors" / f"{name}.json"
                if path.exists() and path.read_text(encoding="utf-8") == text:
                    continue
                stale.append(path.name)
                if not check:
                    path.write_text(text, encoding="utf-8")
            for p in stale:
                print(("stale: " if check else "wrote: ") + p)
            return 1 if check and stale else 0
        finally:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
