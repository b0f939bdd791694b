"""One small URI layer over fsspec: local paths (the embedded default) and `s3://` through s3fs.

Endpoint, region and credentials come from the standard AWS environment variables
(`AWS_ENDPOINT_URL[_S3]`, `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`) or from the job config's `storage` section;
secrets are held as `SecretStr` so they never reach printed configs or metrics.

Every operation rides out storage outages: botocore retries each S3 request a few times
(`standard` mode), and each `Storage` call is retried on connection-type failures (refused or
reset connections, an unreachable endpoint, timeouts, 5xx and throttling; never 4xx, never a
local-file error other than a transient one) with exponential backoff and jitter for up to
`storage.retry_seconds`; then `StorageUnavailable` (a `ConnectionError`) names the operation,
the URI and how long it tried: every job shows it as one line, exit 1. Retried operations are
idempotent by construction: whole-object PUTs, temp + rename, reads, listings, deletes of what
is there, and `create_exclusive`, whose lost-response case is resolved by comparing bytes.
"""

from __future__ import annotations

import errno
import os
import posixpath
import random
import time
import uuid
from pathlib import Path
from typing import TypeVar
from collections.abc import Callable, Iterator

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
from pydantic import Field, SecretStr

from jobs.lib.config import Strict


class StorageConfig(Strict):
    """Object-store options; None means 'take it from the AWS environment variables'."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    anon: bool = False
    retry_seconds: float = Field(90.0, ge=0, description="how long a storage call is retried through an outage "
                                 "(connection errors, timeouts, 5xx) before the job stops with one line")


T = TypeVar("T")
RETRY_BASE_S, RETRY_CAP_S = 0.2, 5.0   # backoff: 0.2, 0.4, 0.8 ... capped at 5 s, each x [0.5, 1)
# botocore's own retries of one request (connection errors, 5xx, throttling): a few quick ones;
# the budgeted loop in `retry_call` spans longer outages. s3fs adds its own 5 quick retries of
# timeouts and closed connections (S3FileSystem.retries).
BOTO_RETRIES = {"mode": "standard", "total_max_attempts": 3}
# S3 error codes worth retrying whatever their status: throttling, timeouts, and the 409 AWS
# asks clients to retry when two conditional writes race
TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "TooManyRequestsException",
                             "RequestLimitExceeded", "RequestTimeout", "RequestTimeoutException",
                             "PriorRequestNotComplete", "InternalError", "ServiceUnavailable",
                             "ConditionalRequestConflict"})
# local files (NFS-style mounts): a busy or stale handle, a timeout; never ENOENT, EACCES, ENOSPC...
TRANSIENT_ERRNOS = frozenset({errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.ESTALE})


class StorageUnavailable(ConnectionError):
    """Storage stayed unreachable for the whole retry budget; `str()` is the one line shown."""


def connection_errors() -> tuple[type[BaseException], ...]:
    """botocore's connection-type errors (not Python ConnectionErrors), as they come raw out of
    pyarrow / Ray Data reads and writes through `arrow_fs`: for Ray's `retry_exceptions` and
    the jobs' one-line errors. StorageUnavailable is not among them (its budget is spent)."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError

    return BotoConnectionError, HTTPClientError


def is_transient(err: BaseException, local: bool = False) -> bool:
    """Whether a failed storage call may succeed when repeated: connection-type errors only."""
    if isinstance(err, StorageUnavailable):
        return False  # a nested call already spent the budget
    if local:
        return isinstance(err, OSError) and err.errno in TRANSIENT_ERRNOS
    import http.client

    from botocore.exceptions import ClientError

    kinds = (*connection_errors(), ConnectionError, TimeoutError, http.client.IncompleteRead)
    try:
        import aiohttp

        kinds += (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
    except ImportError:  # pragma: no cover - s3fs brings it
        pass
    for _ in range(4):  # s3fs raises a translated OSError whose __cause__ is botocore's error
        if isinstance(err, ClientError):
            status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            return status >= 500 or status == 429 or err.response.get("Error", {}).get("Code") in TRANSIENT_CODES
        if isinstance(err, kinds):
            return True
        if err.__cause__ is None:
            return False
        err = err.__cause__
    return False


def backoff_seconds(attempt: int, rand: Callable[[], float] = random.random) -> float:
    """Sleep before retry `attempt` (0, 1, ...): min(cap, base * 2**attempt), jittered into
    [half, all] of it so that many workers hit by one outage do not retry in step."""
    return min(RETRY_CAP_S, RETRY_BASE_S * 2 ** attempt) * (0.5 + 0.5 * rand())


def retry_call(fn: Callable[[], T], op: str, uri: str, budget_s: float, local: bool = False, *,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
               rand: Callable[[], float] = random.random) -> T:
    """fn(), repeated on transient errors until it succeeds or `budget_s` seconds have passed
    since the call began (the last attempt starts at the budget's end); then StorageUnavailable.
    Other errors propagate at once. `fn` must be idempotent."""
    start, attempt = clock(), 0
    while True:
        try:
            return fn()
        except Exception as err:
            if not is_transient(err, local):
                raise
            waited = clock() - start
            if waited >= budget_s:
                last = " ".join(f"{type(err).__name__}: {err}".split())
                raise StorageUnavailable(
                    f"{op} {uri}: storage unreachable for {waited:.1f} s ({attempt + 1} attempts, "
                    f"storage.retry_seconds={budget_s:g}); last error: {last[:300]}") from err
            sleep(min(backoff_seconds(attempt, rand), budget_s - waited))
            attempt += 1


def scheme_of(uri: str) -> str:
    """'s3' for s3:// URIs, 'file' for local paths and file:// URIs."""
    if "://" not in uri:
        return "file"
    scheme = uri.split("://", 1)[0].lower()
    if scheme in ("s3", "s3a"):
        return "s3"
    if scheme == "file":
        return "file"
    raise ValueError(f"unsupported storage URI '{uri}': use a local path, file:// or s3://")


def join(uri: str, *parts: str) -> str:
    """Join URI path segments with '/' (local paths keep their OS form)."""
    if scheme_of(uri) == "file" and "://" not in uri:
        return str(Path(uri, *parts))
    return posixpath.join(uri.rstrip("/"), *parts)


def run_dir(output_uri: str, job: str, run_id: str) -> str:
    """The deterministic run directory: <output_uri>/<job>/<run_id>."""
    return join(output_uri, job, run_id)


def _s3_kwargs(cfg: StorageConfig) -> dict:
    env = os.environ
    endpoint = cfg.endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = cfg.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    kwargs: dict = {"anon": cfg.anon, "use_listings_cache": False, "skip_instance_cache": False,
                    "config_kwargs": {"retries": dict(BOTO_RETRIES)}}
    client: dict = {}
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    if region:
        client["region_name"] = region
    # Static keys are resolved here, on the driver, so that Ray workers on nodes without the
    # variables can still write; without any, botocore's own chain (instance roles...) applies.
    key = cfg.access_key_id.get_secret_value() if cfg.access_key_id else env.get("AWS_ACCESS_KEY_ID")
    secret = (cfg.secret_access_key.get_secret_value() if cfg.secret_access_key
              else env.get("AWS_SECRET_ACCESS_KEY"))
    if key and secret:
        kwargs["key"], kwargs["secret"] = key, secret
        if env.get("AWS_SESSION_TOKEN") and not cfg.access_key_id:
            kwargs["token"] = env["AWS_SESSION_TOKEN"]
    if client:
        kwargs["client_kwargs"] = client
    return kwargs


def _quiet_reset_noise(loop) -> None:
    """aiohttp leaves a 'Task exception was never retrieved' traceback on stderr for each request
    whose connection is reset under it, though the request itself fails and is retried (or
    reported in one line): drop just those, everything else goes to asyncio's default handler."""
    import aiohttp

    def handler(loop, context: dict) -> None:
        if not (isinstance(context.get("exception"), aiohttp.ClientConnectionError)
                and "never retrieved" in context.get("message", "")):
            loop.default_exception_handler(context)

    if loop.get_exception_handler() is None:
        loop.set_exception_handler(handler)


def _temp_beside(path: str, data: bytes) -> str:
    """A complete, synced temp file next to `path` (then renamed or linked into place)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _replace_local(path: str, data: bytes) -> None:
    tmp = _temp_beside(path, data)
    try:
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):  # a failed attempt leaves no temp file behind
            os.unlink(tmp)
        raise


class Storage:
    """Read, write and list objects by URI; writes are atomic (temp + rename locally). Every call
    is retried through outages for up to `cfg.retry_seconds` (module docstring)."""

    def __init__(self, cfg: StorageConfig | None = None):
        self.cfg = cfg or StorageConfig()
        self._fs: dict[str, fsspec.AbstractFileSystem] = {}

    def fs(self, uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """(filesystem, path inside it) for a URI. Calls made on it directly are retried only by
        botocore and s3fs, not through the outage budget."""
        scheme = scheme_of(uri)
        if scheme not in self._fs:
            if scheme == "s3":
                self._fs[scheme] = fsspec.filesystem("s3", **_s3_kwargs(self.cfg))
                _quiet_reset_noise(self._fs[scheme].loop)
            else:
                self._fs[scheme] = fsspec.filesystem("file")
        path = uri.split("://", 1)[1] if "://" in uri else os.path.abspath(uri)
        return self._fs[scheme], path

    def _retry(self, op: str, uri: str, fn: Callable[[], T]) -> T:
        return retry_call(fn, op, uri, self.cfg.retry_seconds, local=scheme_of(uri) == "file")

    def arrow_fs(self, uri: str):
        """(pyarrow filesystem, path) for pyarrow / Ray Data readers and writers; on S3 its
        metadata calls and opens for reading are retried like Storage's own."""
        fs, path = self.fs(uri)
        if scheme_of(uri) == "file":
            return pafs.LocalFileSystem(), path
        return pafs.PyFileSystem(_RetryingHandler(fs, self.cfg.retry_seconds)), path

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Write an object atomically: readers see the old object or the whole new one."""
        fs, path = self.fs(uri)
        if scheme_of(uri) == "file":
            self._retry("write", uri, lambda: _replace_local(path, data))
        else:
            self._retry("write", uri, lambda: fs.pipe_file(path, data))  # one PUT: atomic on S3

    def create_exclusive(self, uri: str, data: bytes) -> bool:
        """Create an object only if none exists there, atomically: True if this call created it,
        False if it existed. Locally: a complete temp file hard-linked into place (link fails on
        an existing name); on S3: a PUT with If-None-Match: * (a 412 means it existed).

        A retry after a lost response can find the object its own earlier attempt created: then
        an object holding exactly `data` counts as created by this call. Callers make `data`
        unique to themselves (a lease names its owner and expiry) or equal only for the same work
        (a run key: two runs of one config may both resume it)."""
        fs, path = self.fs(uri)
        attempts = 0

        def create() -> bool:
            nonlocal attempts
            attempts += 1
            try:
                if scheme_of(uri) == "file":
                    tmp = _temp_beside(path, data)
                    try:
                        os.link(tmp, path)
                    finally:
                        os.unlink(tmp)
                else:
                    fs.pipe_file(path, data, IfNoneMatch="*")
                return True
            except FileExistsError:
                return attempts > 1 and fs.cat_file(path) == data

        return self._retry("create", uri, create)

    def write_text(self, uri: str, text: str) -> None:
        self.write_bytes(uri, text.encode())

    def read_bytes(self, uri: str) -> bytes:
        fs, path = self.fs(uri)
        return self._retry("read", uri, lambda: fs.cat_file(path))

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode()

    def exists(self, uri: str) -> bool:
        fs, path = self.fs(uri)
        if scheme_of(uri) == "s3" and "/" not in path.strip("/"):
            return self._retry("exists", uri, lambda: _bucket_exists(fs, path))
        return self._retry("exists", uri, lambda: fs.exists(path))

    def list(self, uri: str) -> list[str]:
        """Names (not full URIs) directly under a prefix, sorted; [] when it does not exist."""
        fs, path = self.fs(uri)

        def names() -> list[str]:
            try:  # no exists() first: s3fs's for a bucket answers False when it cannot connect
                found = fs.ls(path, detail=False)
            except FileNotFoundError:
                return []
            return sorted(posixpath.basename(p.rstrip("/")) for p in found)

        return self._retry("list", uri, names)

    def walk_files(self, uri: str) -> Iterator[str]:
        """Every object under a prefix, as full URIs."""
        fs, path = self.fs(uri)
        prefix = uri[: len(uri) - len(path)] if "://" in uri else ""
        yield from (prefix + p for p in self._retry("list", uri, lambda: sorted(fs.find(path))))

    def delete(self, uri: str, recursive: bool = False) -> None:
        """Remove an object (or a prefix with recursive=True); missing is fine."""
        fs, path = self.fs(uri)

        def rm() -> None:
            if fs.exists(path):
                try:
                    fs.rm(path, recursive=recursive)
                except FileNotFoundError:
                    pass  # gone meanwhile (or by an earlier attempt whose answer was lost)

        self._retry("delete", uri, rm)

    def makedirs(self, uri: str) -> None:
        fs, path = self.fs(uri)
        if scheme_of(uri) == "file":
            self._retry("makedirs", uri, lambda: fs.makedirs(path, exist_ok=True))


def _bucket_exists(fs, bucket: str) -> bool:
    """Whether a bucket exists; errors propagate (s3fs's exists() for a bucket answers False
    when it cannot connect, which would hide an outage)."""
    try:
        fs.ls(bucket, detail=False)
        return True
    except FileNotFoundError:
        return False


class _RetryingHandler(pafs.FSSpecHandler):
    """pyarrow over fsspec with its metadata calls and opens for reading retried through outages.
    Streams being written are not: their bytes go with a failed upload (botocore and s3fs still
    retry each request; the jobs rewrite such outputs whole on a rerun)."""

    def __init__(self, fs, budget_s: float):
        super().__init__(fs)
        self.budget_s = budget_s

    def _retry(self, op: str, path: str, fn: Callable[[], T]) -> T:
        return retry_call(fn, op, f"s3://{path}", self.budget_s)

    def get_file_info(self, paths):
        return self._retry("stat", paths[0] if paths else "",
                           lambda: super(_RetryingHandler, self).get_file_info(paths))

    def get_file_info_selector(self, selector):
        return self._retry("list", selector.base_dir,
                           lambda: super(_RetryingHandler, self).get_file_info_selector(selector))

    def create_dir(self, path, recursive):
        return self._retry("makedirs", path, lambda: super(_RetryingHandler, self).create_dir(path, recursive))

    def open_input_file(self, path):
        def open_file():
            if self.fs.info(path)["type"] != "file":  # errors propagate (fsspec's isfile hides them)
                raise FileNotFoundError(path)
            return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")

        return self._retry("read", path, open_file)

    def open_input_stream(self, path):
        return self.open_input_file(path)
