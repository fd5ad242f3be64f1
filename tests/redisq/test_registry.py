"""The server registry as the learner reads it: only registrations signed with the admin key
are trusted with it; entries that do not parse or verify are skipped and counted; a server
that does not answer its health check is dropped before the broadcast, never asked to join.

The "servers" here are real HTTP listeners on free ports that record every request (what a
hostile or hung process at a registered URL would see); Redis is a real redis-server.
"""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis
import torch
from transformers import AutoModelForCausalLM

from gspo_rl.contract.schema import Keys
from gspo_rl.learner.weights.broadcast import BroadcastSync
from gspo_rl.redisq.registry import (
    ServerInfo,
    live_servers,
    parse_registration,
    read_registry,
    register,
    registration,
)
from tests.conftest import free_port

KEY = "the-admin-key"
KEYS = Keys()


class Recorder:
    """An HTTP listener that records each request's path and Authorization header; with
    ``hang`` it never answers (a paused process) until closed."""

    def __init__(self, hang: bool = False) -> None:
        self.requests: list[tuple[str, str | None]] = []
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                outer.requests.append((self.path, self.headers.get("Authorization")))
                if hang:
                    outer.release.wait(120)
                with contextlib.suppress(OSError):  # the client may have given up
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")

            do_GET = do_POST = _any

            def log_message(self, *args: object) -> None:
                return None

        self.port = free_port()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def model(tiny_model_dir) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def _info(sid: str, url: str) -> ServerInfo:
    return ServerInfo(server_id=sid, url=url, engine="hf", model="tiny")


def _raw(r: redis.Redis, sid: str, value: str) -> None:
    r.hset(KEYS.servers, sid, value)
    r.set(KEYS.server_alive(sid), "1", ex=60)


def test_signed_registrations_verify_and_forgeries_do_not(r: redis.Redis) -> None:
    register(r, KEYS, _info("good", "http://a:1"), KEY)
    register(r, KEYS, _info("forged", "http://evil:1"), "a-guessed-key")
    register(r, KEYS, _info("unsigned", "http://evil:2"), None)
    _raw(r, "garbage", "{not json")
    _raw(r, "shape", '{"info": 3, "sig": ""}')
    _raw(r, "renamed", registration(_info("good", "http://evil:3"), KEY))  # a copied entry
    reg = read_registry(r, KEYS, KEY)
    assert [s.server_id for s in reg.servers] == ["good"]
    assert sorted(reg.rejected) == ["forged", "garbage", "renamed", "shape", "unsigned"]
    assert "signature" in reg.rejected["forged"] and "malformed" in reg.rejected["garbage"]
    # Without an admin key there is nothing to leak: unsigned entries are taken; signed ones
    # want a key this learner lacks (their admin routes would answer 401).
    keyless = read_registry(r, KEYS, for_push=True)
    assert [s.server_id for s in keyless.servers] == ["unsigned"]
    assert "has none" in keyless.rejected["good"]
    assert [s.server_id for s in live_servers(r, KEYS)] == ["forged", "good", "unsigned"]
    with pytest.raises(ValueError, match="signature"):
        parse_registration(registration(_info("x", "http://a:1"), KEY), "other")


def test_push_never_sends_the_key_to_an_unverified_entry(r: redis.Redis, model) -> None:
    evil = Recorder()
    try:
        register(r, KEYS, _info("forged", evil.url), "not-the-key")
        _raw(r, "garbage", "\xff{")
        sync = BroadcastSync(r, KEYS, admin_key=KEY, timeout_s=5)
        try:
            report = sync.push(model, version=1)  # never raises on a bad entry
        finally:
            sync.close()
        assert report.ok and report.servers == [] and report.rejected == ["forged", "garbage"]
        assert evil.requests == []  # not even a health check: it never saw the key
    finally:
        evil.close()


def test_a_hung_server_is_dropped_by_its_health_check_before_the_broadcast(
        r: redis.Redis, model) -> None:
    hung = Recorder(hang=True)
    try:
        register(r, KEYS, _info("hung", hung.url), KEY, ttl_s=60)
        # A 60 s sync timeout: waiting for the join would hold the learner for a minute.
        sync = BroadcastSync(r, KEYS, admin_key=KEY, timeout_s=60, health_timeout_s=1)
        try:
            report = sync.push(model, version=1)
        finally:
            sync.close()
        assert report.dropped[0] == "hung" and report.servers == []
        assert {path for path, _ in hung.requests} == {"/health"}  # never asked to join
    finally:
        hung.close()


def test_redis_down_fails_the_push_without_raising(redis_server, model) -> None:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=2)
    sync = BroadcastSync(client, KEYS, admin_key=KEY, timeout_s=5)
    redis_server.stop(hard=True)
    try:
        report = sync.push(model, version=1)
    finally:
        sync.close()
    assert not report.ok and "registry" in report.error
