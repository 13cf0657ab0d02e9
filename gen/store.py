"""A small key-value store for tuning / verify / bench results: a local directory, optionally shared through Redis.

Keys are digests of everything a result depends on (`result_key`): spec sha256, template digest, the config-space
fingerprint, target, the triton/torch/gen versions and, for measured results, the device. Values are JSON objects.

    store = open_store()          # GEN_CACHE_REDIS=redis://host:6379/0 -> Redis-then-local reads, writes to both
    key = result_key("tune", spec.sha256, tdigest, config_space_fingerprint(cands), "sm90", device="NVIDIA H200")
    store.get(key) / store.put(key, {...})

Redis is an accelerator, never a dependency of a run: when it is down or errors, the store logs one warning on the
`gen.store` logger and carries on with the local directory.

`configure_triton_remote_cache(url)` points Triton's own compiled-kernel cache at the same Redis, through the knobs
triton 3.6.0 reads (triton/knobs.py: TRITON_CACHE_MANAGER, TRITON_REMOTE_CACHE_BACKEND, TRITON_REDIS_HOST/PORT).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from urllib.parse import urlparse

log = logging.getLogger("gen.store")

ENV_REDIS = "GEN_CACHE_REDIS"
STORE_VERSION = "1"          # bump when the meaning of stored results changes
REDIS_PREFIX = "gen:result:"


# ---- keys ----

def versions() -> dict:
    from importlib.metadata import version

    from . import __version__

    return {"gen": __version__, "triton": version("triton"), "torch": version("torch").split("+")[0]}


def config_space_fingerprint(candidates: list[dict]) -> str:
    """The search space as sorted JSON: the same set of configs gives the same fingerprint, whatever the order."""
    return json.dumps(sorted(json.dumps(c, sort_keys=True) for c in candidates))


def result_key(kind: str, spec_sha: str, template_digest: str, config_space: str, target: str,
               device: str | None = None, vers: dict | None = None) -> str:
    """sha256 of every input the result depends on. `device` only for device-specific (measured) results."""
    blob = json.dumps({"v": STORE_VERSION, "kind": kind, "spec": spec_sha, "template": template_digest,
                       "space": config_space, "target": target, "device": device,
                       "versions": vers if vers is not None else versions()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


# ---- backends ----

class LocalStore:
    """One JSON file per key under `root` (default: .cache/results); writes are atomic (tmp file + rename)."""

    def __init__(self, root: str | Path | None = None):
        if root is None:
            from .cache import cache_dir

            root = cache_dir("results")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        try:
            return json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, value: dict) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(value, f, sort_keys=True)
        os.replace(tmp, path)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"


class RedisStore:
    """Values as JSON strings under gen:result:<key>. Errors propagate (LayeredStore decides what they mean)."""

    def __init__(self, url: str, timeout_s: float = 2.0):
        import redis

        self.url = url
        self.client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)

    def get(self, key: str) -> dict | None:
        raw = self.client.get(REDIS_PREFIX + key)
        return None if raw is None else json.loads(raw)

    def put(self, key: str, value: dict) -> None:
        self.client.set(REDIS_PREFIX + key, json.dumps(value, sort_keys=True))

    def __repr__(self) -> str:
        return f"RedisStore({_redact(self.url)!r})"


class LayeredStore:
    """Reads Redis then local (a Redis hit is copied to local); writes go to both. The first Redis error logs one
    warning and switches Redis off for the rest of this store's life; the run never fails because of it."""

    def __init__(self, remote, local: LocalStore):
        self.remote, self.local = remote, local
        self.remote_ok = True

    def _remote_failed(self, op: str, e: Exception) -> None:
        if self.remote_ok:
            log.warning("shared result cache %r unavailable (%s on %s: %s); using the local cache %s only",
                        self.remote, type(e).__name__, op, e, self.local.root)
        self.remote_ok = False

    def get(self, key: str) -> dict | None:
        if self.remote_ok:
            try:
                value = self.remote.get(key)
                if value is not None:
                    self.local.put(key, value)
                    return value
            except Exception as e:  # redis errors, timeouts, refused connections, bad JSON
                self._remote_failed("get", e)
        return self.local.get(key)

    def put(self, key: str, value: dict) -> None:
        self.local.put(key, value)
        if self.remote_ok:
            try:
                self.remote.put(key, value)
            except Exception as e:
                self._remote_failed("put", e)

    def __repr__(self) -> str:
        return f"LayeredStore({self.remote!r}, {self.local!r})"


def open_store(local_dir: str | Path | None = None, url: str | None = None):
    """The run's result store: local only, or Redis-then-local when GEN_CACHE_REDIS (or `url`) is set."""
    local = LocalStore(local_dir)
    url = url if url is not None else os.environ.get(ENV_REDIS, "")
    if not url:
        return local
    try:
        remote = RedisStore(url)
    except Exception as e:  # redis client missing, malformed URL
        store = LayeredStore(None, local)
        store._remote_failed("open", e)
        return store
    return LayeredStore(remote, local)


def _redact(url: str) -> str:
    p = urlparse(url)
    return url.replace(p.password, "***") if p.password else url


# ---- Triton's compiled-kernel cache on the same Redis ----

_TRITON_WARNED = [False]


def _triton_warn(e: Exception) -> None:
    if not _TRITON_WARNED[0]:
        log.warning("Triton remote cache unavailable (%s: %s); compiling with the local Triton cache only",
                    type(e).__name__, e)
    _TRITON_WARNED[0] = True


_BACKEND_CLASS = []


def _triton_backend_class():
    """Built on first use so that importing gen.store does not import triton (TRITON_INTERPRET must be set first)."""
    if _BACKEND_CLASS:
        return _BACKEND_CLASS[0]
    from triton.runtime.cache import RedisRemoteCacheBackend

    class TritonRedisBackend(RedisRemoteCacheBackend):
        """Triton's RedisRemoteCacheBackend (same key format, same get/put), with three fixes:
        (a) triton 3.6.0's own __init__ reads `knobs.cache.redis`, which does not exist (the knobs are `knobs.redis`),
            so the stock class raises AttributeError on every compile; this one reads `knobs.redis`;
        (b) it connects with the full GEN_CACHE_REDIS URL (db, password), not only TRITON_REDIS_HOST/PORT;
        (c) a Redis error is a cache miss (one warning), not a failed compile."""

        def __init__(self, key):  # deliberately not calling the broken base __init__
            import redis

            from triton import knobs

            self._key = key
            self._key_fmt = knobs.redis.key_format
            url = os.environ.get(ENV_REDIS) or f"redis://{knobs.redis.host}:{knobs.redis.port}/0"
            self._redis = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)

        def get(self, filenames):
            try:
                return super().get(filenames)
            except Exception as e:
                _triton_warn(e)
                return {}

        def put(self, filename, data):
            try:
                super().put(filename, data)
            except Exception as e:
                _triton_warn(e)

    TritonRedisBackend.__module__ = __name__
    _BACKEND_CLASS.append(TritonRedisBackend)
    return TritonRedisBackend


def __getattr__(name):  # PEP 562: TRITON_REMOTE_CACHE_BACKEND=gen.store:TritonRedisBackend resolves here
    if name == "TritonRedisBackend":
        return _triton_backend_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def triton_remote_cache_env(url: str) -> dict:
    """The environment triton 3.6.0 reads to use a remote cache: RemoteCacheManager keeps a local file copy, the
    backend class talks to Redis (knobs.cache.manager_class / remote_manager_class / knobs.cache.redis.*)."""
    p = urlparse(url)
    return {
        "TRITON_CACHE_MANAGER": "triton.runtime.cache:RemoteCacheManager",
        "TRITON_REMOTE_CACHE_BACKEND": "gen.store:TritonRedisBackend",
        "TRITON_REDIS_HOST": p.hostname or "localhost",
        "TRITON_REDIS_PORT": str(p.port or 6379),
    }


_CONFIGURED: dict = {}


def configure_triton_remote_cache(url: str | None = None) -> bool:
    """Point this process's (and its children's) Triton kernel cache at Redis. Returns whether it did.

    With no URL (argument or GEN_CACHE_REDIS) it does nothing. When Redis does not answer a ping it logs one warning
    and leaves Triton on its local file cache, so a Redis outage never fails a compile.
    """
    url = url if url is not None else os.environ.get(ENV_REDIS, "")
    if not url:
        return False
    if url in _CONFIGURED:  # one ping (and at most one warning) per process, however often it is called
        return _CONFIGURED[url]
    try:
        import redis

        redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping()
    except Exception as e:
        _triton_warn(e)
        _CONFIGURED[url] = False
        return False
    _CONFIGURED[url] = True
    os.environ[ENV_REDIS] = url  # TritonRedisBackend reads the full URL from here (also in spawned workers)
    os.environ.update(triton_remote_cache_env(url))
    return True
