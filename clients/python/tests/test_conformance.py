"""The contract's conformance vectors (lua/conformance/README.md), run with this package's shipped
scripts on a private redis-server: its scripts hash to lua/SHA1SUMS, every vector's replies are the
recorded ones, and a vector changed by one byte of a reply fails."""

from __future__ import annotations

import hashlib
import json
import random
import secrets
from pathlib import Path

import pytest
import redis

from fleet_budget import scripts

REPO = Path(__file__).resolve().parents[3]
VECTORS = REPO / "lua" / "conformance" / "vectors"
CLOCK = "redis.call('TIME')"
FILE_KEYS = {"format", "about", "vectors"}
VECTOR_KEYS = {"name", "about", "steps"}
STEP_KEYS = {"script", "keys", "args", "now_ms", "redis", "reply", "error", "error_prefix"}


class Mismatch(AssertionError):
    """A step whose answer is not the vector's."""


def sha1sums() -> dict[str, str]:
    sums = {}
    for line in (REPO / "lua" / "SHA1SUMS").read_text(encoding="utf-8").splitlines():
        digest, name = line.split()
        sums[name.removesuffix(".lua")] = digest
    return sums


def vector_files() -> list[Path]:
    files = sorted(VECTORS.glob("*.json"))
    assert files, f"no vectors in {VECTORS}"
    return files


def load(path: Path) -> dict:
    doc = json.loads(path.read_text(encoding="utf-8"))
    check_shape(doc, path.name)
    return doc


def check_shape(doc: dict, where: str) -> None:
    """Unknown keys are an error: a typo in a vector never passes silently."""
    assert set(doc) == FILE_KEYS and doc["format"] == 1, f"{where}: not a format-1 vector file"
    for vector in doc["vectors"]:
        assert set(vector) == VECTOR_KEYS, f"{where}: vector keys {sorted(vector)}"
        for i, step in enumerate(vector["steps"]):
            unknown = set(step) - STEP_KEYS
            expectations = [k for k in ("reply", "error", "error_prefix") if k in step]
            assert not unknown and len(expectations) == 1 and (("script" in step) != ("redis" in step)), \
                f"{where}: {vector['name']!r} step {i}: bad step {sorted(step)}"


def clocked(text: str, now_ms: int) -> str:
    assert text.count(CLOCK) == 1, "the script does not read the clock exactly once"
    return text.replace(CLOCK, "{'%d', '%d'}" % (now_ms // 1000, now_ms % 1000 * 1000))


def subst(value, prefix: str):
    if isinstance(value, str):
        return value.replace("$P", prefix)
    if isinstance(value, list):
        return [subst(v, prefix) for v in value]
    return value


def as_json(reply):
    """A RESP2 reply as the vectors write it."""
    if isinstance(reply, bytes):
        return reply.decode("utf-8")
    if isinstance(reply, list):
        return [as_json(v) for v in reply]
    return reply


def matches(expected, got) -> bool:
    if isinstance(expected, dict):
        return expected == {"any_integer": True} and isinstance(got, int) and not isinstance(got, bool)
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(map(matches, expected, got))
    if isinstance(expected, bool) or isinstance(got, bool):
        return False
    return type(expected) is type(got) and expected == got


def run_vector(conn: redis.Redis, vector: dict, prefix: str) -> int:
    """Runs the steps in order; raises Mismatch at the first answer that is not the vector's.
    Returns how many steps ran."""
    for i, step in enumerate(vector["steps"]):
        try:
            if "script" in step:
                text = scripts.text(step["script"])
                if "now_ms" in step:
                    text = clocked(text, step["now_ms"])
                keys, args = subst(step["keys"], prefix), subst(step["args"], prefix)
                got = conn.execute_command("EVAL", text, len(keys), *keys, *args)
            else:
                got = conn.execute_command(*subst(step["redis"], prefix))
            error = None
        except redis.exceptions.ResponseError as e:
            # redis-py drops Redis's own leading "ERR ", as the vectors do.
            got, error = None, str(e)
        where = f"{vector['name']!r} step {i}"
        if "reply" in step:
            if error is not None:
                raise Mismatch(f"{where}: expected a reply, got the error {error!r}")
            expected = subst(step["reply"], prefix)
            if not matches(expected, as_json(got)):
                raise Mismatch(f"{where}: expected {expected!r}, got {as_json(got)!r}")
        else:
            if error is None:
                raise Mismatch(f"{where}: expected an error, got {as_json(got)!r}")
            if "error" in step and error != subst(step["error"], prefix):
                raise Mismatch(f"{where}: expected the error {subst(step['error'], prefix)!r}, got {error!r}")
            if "error_prefix" in step and not error.startswith(subst(step["error_prefix"], prefix)):
                raise Mismatch(f"{where}: expected an error starting {step['error_prefix']!r}, got {error!r}")
    return len(vector["steps"])


@pytest.fixture
def conn(redis_url):
    # RESP2, as lua/conformance/README.md asks (redis-py 8 speaks RESP3 unless told).
    client = redis.Redis.from_url(redis_url, protocol=2, socket_timeout=5)
    yield client
    client.close()


def raw(conn: redis.Redis, *args):
    """A command's reply without redis-py's callbacks."""
    c = conn.connection_pool.get_connection()
    try:
        c.send_command(*args)
        reply = c.read_response()
    finally:
        conn.connection_pool.release(c)
    if isinstance(reply, redis.exceptions.ResponseError):
        raise reply
    return reply


class RawConn:
    def __init__(self, conn):
        self.conn = conn

    def execute_command(self, *args):
        return raw(self.conn, *args)


def clean(conn, prefix: str) -> None:
    for key in conn.scan_iter(match=f"{prefix}*"):
        conn.delete(key)


def test_shipped_scripts_hash_to_sha1sums(conn):
    sums = sha1sums()
    assert len(sums) == len(list((REPO / "lua").glob("*.lua")))
    for name, digest in sums.items():
        text = scripts.text(name)
        assert hashlib.sha1(text.encode("utf-8")).hexdigest() == digest, name
        assert raw(conn, "SCRIPT", "LOAD", text).decode() == digest, name


@pytest.mark.parametrize("path", vector_files(), ids=lambda p: p.stem)
def test_vectors(conn, path):
    doc = load(path)
    run_id = secrets.token_hex(4)
    steps = 0
    for n, vector in enumerate(doc["vectors"]):
        prefix = f"fbconf-py-{run_id}-{n}"
        try:
            steps += run_vector(RawConn(conn), vector, prefix)
        finally:
            clean(conn, prefix)
    print(f"{path.name}: {len(doc['vectors'])} vectors, {steps} steps passed")


def mutate(reply, rng: random.Random):
    """The expectation with one byte of its JSON text changed (a digit or a letter)."""
    text = json.dumps(reply)
    spots = [i for i, ch in enumerate(text) if ch.isalnum()]
    for _ in range(100):
        i = rng.choice(spots)
        ch = text[i]
        new = str((int(ch) + 1) % 10) if ch.isdigit() else ("x" if ch != "x" else "y")
        changed = text[:i] + new + text[i + 1:]
        try:
            value = json.loads(changed)
        except json.JSONDecodeError:
            continue
        if value != reply:
            return value
    raise AssertionError(f"no one-byte change of {text}")


@pytest.mark.parametrize("path", vector_files(), ids=lambda p: p.stem)
def test_an_answer_changed_by_one_byte_fails(conn, path):
    """In every vector, one step's expected reply (or error) changed by one byte: the runner fails
    at that step."""
    doc = load(path)
    rng = random.Random(path.name)
    for n, vector in enumerate(doc["vectors"]):
        answers = [(i, k) for i, s in enumerate(vector["steps"]) for k in ("reply", "error", "error_prefix")
                   if k in s and any(ch.isalnum() for ch in json.dumps(s[k]))]
        i, k = rng.choice(answers)
        changed = json.loads(json.dumps(vector))
        changed["steps"][i][k] = mutate(vector["steps"][i][k], rng)
        prefix = f"fbconf-py-mut-{secrets.token_hex(4)}-{n}"
        try:
            with pytest.raises(Mismatch, match=f"step {i}:"):
                run_vector(RawConn(conn), changed, prefix)
        finally:
            clean(conn, prefix)
