"""The result store: local round trip, keys, sharing through a real redis-server, and Redis being down."""
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from gen.store import (LayeredStore, LocalStore, config_space_fingerprint, configure_triton_remote_cache, open_store,
                       result_key, triton_remote_cache_env)

from .conftest import ROOT, child_env

VERS = {"gen": "0.1.0", "triton": "3.6.0", "torch": "2.13.0"}
KEY_ARGS = dict(kind="tune/1", spec_sha="a" * 64, template_digest="b" * 64,
                config_space=config_space_fingerprint([{"BLOCK_N": 128}, {"BLOCK_N": 256}]), target="sm90",
                device="NVIDIA H200 (sm_90)", vers=VERS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_redis_env(monkeypatch):
    for k in ("GEN_CACHE_REDIS", "TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND", "TRITON_REDIS_HOST",
              "TRITON_REDIS_PORT"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture(scope="module")
def redis_url():
    """A real redis-server on a free loopback port, for this module only."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("GEN_REQUIRE_REDIS") == "1":  # CI sets this: a missing server must fail, not skip
            pytest.fail("GEN_REQUIRE_REDIS=1 but redis-server is not installed (apt-get install -y redis-server)")
        pytest.skip("redis-server not installed (apt-get install -y redis-server)")
    pytest.importorskip("redis", reason="the redis client is not installed (pip install 'redis>=5')")
    import redis

    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url, socket_connect_timeout=0.2).ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(f"redis-server did not start on port {port}")
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ---- keys ----

def test_key_is_stable_and_changes_with_every_part():
    base = result_key(**KEY_ARGS)
    assert base == result_key(**KEY_ARGS) and len(base) == 64
    changes = {"kind": "verify/1", "spec_sha": "c" * 64, "template_digest": "d" * 64,
               "config_space": config_space_fingerprint([{"BLOCK_N": 128}]), "target": "triton",
               "device": "NVIDIA B200 (sm_100)", "vers": {**VERS, "triton": "3.5.0"}}
    for part, value in changes.items():
        assert result_key(**{**KEY_ARGS, part: value}) != base, part
    for ver in ("gen", "torch"):
        assert result_key(**{**KEY_ARGS, "vers": {**VERS, ver: "9.9"}}) != base, ver
    assert result_key(**{**KEY_ARGS, "device": None}) != base  # device-independent results key without it


def test_config_space_fingerprint_ignores_order_only():
    a, b = {"BLOCK_N": 128, "STAGES": 3}, {"STAGES": 4, "BLOCK_N": 256}
    assert config_space_fingerprint([a, b]) == config_space_fingerprint([b, a])
    assert config_space_fingerprint([a, b]) != config_space_fingerprint([a])


def test_key_uses_the_installed_versions_by_default():
    from gen.store import versions

    import triton

    v = versions()
    assert set(v) == {"gen", "triton", "torch"} and v["triton"] == triton.__version__
    args = {k: w for k, w in KEY_ARGS.items() if k != "vers"}
    assert result_key(**args) == result_key(**args, vers=v)


# ---- local ----

def test_local_round_trip(tmp_path):
    store = LocalStore(tmp_path / "results")
    key = result_key(**KEY_ARGS)
    assert store.get(key) is None
    value = {"winners": {"M=1 N=2 K=3": {"ms": 0.5, "config": {"BLOCK_N": 128}}}, "rows": [1, 2.5, None]}
    store.put(key, value)
    assert store.get(key) == value
    assert LocalStore(tmp_path / "results").get(key) == value  # a fresh instance reads it back from disk
    store.put(key, {"v": 2})
    assert store.get(key) == {"v": 2}


def test_open_store_without_redis_is_local(tmp_path, no_redis_env, monkeypatch):
    monkeypatch.setenv("GEN_CACHE_DIR", str(tmp_path))
    store = open_store()
    assert isinstance(store, LocalStore) and store.root == tmp_path / "results"


# ---- Redis down ----

def test_redis_down_warns_once_falls_back_and_never_raises(tmp_path, caplog):
    url = f"redis://127.0.0.1:{_free_port()}/0"  # nothing listens there
    store = open_store(tmp_path, url=url)
    assert isinstance(store, LayeredStore)
    key = result_key(**KEY_ARGS)
    with caplog.at_level(logging.WARNING, logger="gen.store"):
        assert store.get(key) is None
        store.put(key, {"ok": 1})
        assert store.get(key) == {"ok": 1}
        store.put(key, {"ok": 2})
        assert store.get(key) == {"ok": 2}
    warnings = [r for r in caplog.records if r.name == "gen.store" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "local" in warnings[0].getMessage()
    assert LocalStore(tmp_path).get(key) == {"ok": 2}


def test_triton_remote_cache_not_configured_when_redis_down(no_redis_env, monkeypatch, caplog):
    import gen.store

    monkeypatch.setattr(gen.store, "_TRITON_WARNED", [False])
    assert configure_triton_remote_cache(None) is False  # no URL: nothing to do
    dead = f"redis://127.0.0.1:{_free_port()}/0"
    with caplog.at_level(logging.WARNING, logger="gen.store"):
        assert configure_triton_remote_cache(dead) is False
        assert configure_triton_remote_cache(dead) is False
    assert len([r for r in caplog.records if r.name == "gen.store"]) == 1
    assert "TRITON_CACHE_MANAGER" not in os.environ  # Triton stays on its local file cache


def test_triton_remote_cache_env_names_the_knobs_triton_reads():
    env = triton_remote_cache_env("redis://cache.example:6390/2")
    assert env == {"TRITON_CACHE_MANAGER": "triton.runtime.cache:RemoteCacheManager",
                   "TRITON_REMOTE_CACHE_BACKEND": "gen.store:TritonRedisBackend",
                   "TRITON_REDIS_HOST": "cache.example", "TRITON_REDIS_PORT": "6390"}


# ---- real Redis, two processes ----

def _run(code: str, cache_dir, url: str | None, extra_env: dict | None = None) -> str:
    env = {k: v for k, v in child_env().items() if not k.startswith(("GEN_CACHE", "TRITON_"))}
    env.update({"GEN_CACHE_DIR": str(cache_dir), **(extra_env or {})})
    if url:
        env["GEN_CACHE_REDIS"] = url
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_two_processes_with_separate_local_caches_share_through_redis(redis_url, tmp_path):
    key = result_key(**{**KEY_ARGS, "spec_sha": os.urandom(32).hex()})
    value = {"winners": {"M=8192 N=8192 K=8192": {"ms": 1.234, "config": {"BLOCK_N": 256}}}}
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    _run(f"""
        from gen.store import open_store, LayeredStore
        s = open_store()
        assert isinstance(s, LayeredStore), s
        s.put({key!r}, {value!r})
        """, dir_a, redis_url)
    assert not dir_b.exists()
    out = _run(f"""
        import json
        from gen.store import open_store, LocalStore
        local_before = LocalStore().get({key!r})
        s = open_store()
        print(json.dumps({{"local_before": local_before, "got": s.get({key!r}), "remote_ok": s.remote_ok,
                           "local_after": LocalStore().get({key!r})}}))
        """, dir_b, redis_url)
    got = json.loads(out)
    assert got["local_before"] is None        # B's own cache had nothing ...
    assert got["got"] == value                # ... it read A's result from Redis
    assert got["remote_ok"] is True
    assert got["local_after"] == value        # and kept a local copy
    assert LocalStore(dir_a / "results").get(key) == value  # A wrote through to its local cache too


def test_a_process_with_redis_down_still_runs(tmp_path):
    out = _run("""
        import logging
        logging.basicConfig(level=logging.WARNING)
        from gen.store import open_store
        s = open_store()
        for i in range(3):
            s.put("k", {"i": i})
        print(s.get("k")["i"])
        """, tmp_path, f"redis://127.0.0.1:{_free_port()}/0")
    assert out.strip() == "2"


TRITON_COMPILE = """
    import json, sys, tempfile, pathlib, importlib.util
    import os
    from gen.store import configure_triton_remote_cache
    if os.environ.get("FORCE_TRITON_REDIS_ENV"):  # as if Redis went down after configure_triton_remote_cache()
        from gen.store import triton_remote_cache_env
        os.environ.update(triton_remote_cache_env(os.environ["GEN_CACHE_REDIS"]))
    else:
        assert configure_triton_remote_cache()
    import triton, triton.language as tl
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    src = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else None
    path = pathlib.Path(tempfile.mkdtemp()) / "k.py"
    path.write_text(
        "import triton, triton.language as tl\\n"
        "@triton.jit\\n"
        "def add_one(x, n, BLOCK: tl.constexpr):\\n"
        "    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\\n"
        "    tl.store(x + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)\\n")
    spec = importlib.util.spec_from_file_location("k", path); mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    hits = []
    knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    k = triton.compile(ASTSource(mod.add_one, {"x": "*fp32", "n": "i32"}, constexprs={"BLOCK": 128}),
                       target=GPUTarget("cuda", 90, 32))
    print(json.dumps({"cache_hit": hits, "manager": type(triton.runtime.cache.get_cache_manager("00" * 32)).__name__,
                      "ptx": "ld.global" in k.asm["ptx"]}))
"""


def test_triton_compiled_kernels_shared_through_redis(redis_url, tmp_path):
    """configure_triton_remote_cache sets the knobs triton 3.6.0 reads: process B, with an empty Triton cache dir,
    gets process A's compiled kernel from Redis instead of compiling it."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    a = json.loads(_run(TRITON_COMPILE, tmp_path / "a", redis_url, {"TRITON_CACHE_DIR": str(tmp_path / "ta")}))
    assert a == {"cache_hit": [False], "manager": "RemoteCacheManager", "ptx": True}
    assert any(k.startswith(b"triton:") for k in client.keys("*"))
    b = json.loads(_run(TRITON_COMPILE, tmp_path / "b", redis_url, {"TRITON_CACHE_DIR": str(tmp_path / "tb")}))
    assert b["cache_hit"] == [True]


def test_triton_compile_survives_redis_going_down(tmp_path):
    dead = f"redis://127.0.0.1:{_free_port()}/0"
    out = json.loads(_run(TRITON_COMPILE, tmp_path, dead, {"TRITON_CACHE_DIR": str(tmp_path / "t"),
                                                           "FORCE_TRITON_REDIS_ENV": "1"}))
    assert out == {"cache_hit": [False], "manager": "RemoteCacheManager", "ptx": True}
