"""One small URI layer over fsspec: local paths (the embedded default) and `s3://` through s3fs.

Endpoint, region and credentials come from the standard AWS environment variables
(`AWS_ENDPOINT_URL[_S3]`, `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`) or from the job config's `storage` section;
secrets are held as `SecretStr` so they never reach printed configs or metrics.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from pathlib import Path
from typing import Iterator

import fsspec
from pydantic import SecretStr

from jobs.lib.config import Strict


class StorageConfig(Strict):
    """Object-store options; None means 'take it from the AWS environment variables'."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    anon: bool = False


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
    kwargs: dict = {"anon": cfg.anon, "use_listings_cache": False, "skip_instance_cache": False}
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


def _temp_beside(path: str, data: bytes) -> str:
    """A complete, synced temp file next to `path` (then renamed or linked into place)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


class Storage:
    """Read, write and list objects by URI; writes are atomic (temp + rename locally)."""

    def __init__(self, cfg: StorageConfig | None = None):
        self.cfg = cfg or StorageConfig()
        self._fs: dict[str, fsspec.AbstractFileSystem] = {}

    def fs(self, uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """(filesystem, path inside it) for a URI."""
        scheme = scheme_of(uri)
        if scheme not in self._fs:
            if scheme == "s3":
                self._fs[scheme] = fsspec.filesystem("s3", **_s3_kwargs(self.cfg))
            else:
                self._fs[scheme] = fsspec.filesystem("file")
        path = uri.split("://", 1)[1] if "://" in uri else os.path.abspath(uri)
        return self._fs[scheme], path

    def arrow_fs(self, uri: str):
        """(pyarrow filesystem, path) for pyarrow / Ray Data readers and writers."""
        import pyarrow.fs as pafs

        fs, path = self.fs(uri)
        if scheme_of(uri) == "file":
            return pafs.LocalFileSystem(), path
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Write an object atomically: readers see the old object or the whole new one."""
        fs, path = self.fs(uri)
        if scheme_of(uri) == "file":
            os.replace(_temp_beside(path, data), path)
        else:
            fs.pipe_file(path, data)  # one PUT: atomic on S3

    def create_exclusive(self, uri: str, data: bytes) -> bool:
        """Create an object only if none exists there, atomically: True if this call created it,
        False if it existed. Locally: a complete temp file hard-linked into place (link fails on
        an existing name); on S3: a PUT with If-None-Match: * (a 412 means it existed)."""
        fs, path = self.fs(uri)
        if scheme_of(uri) == "file":
            tmp = _temp_beside(path, data)
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        try:
            fs.pipe_file(path, data, IfNoneMatch="*")
            return True
        except FileExistsError:
            return False

    def write_text(self, uri: str, text: str) -> None:
        self.write_bytes(uri, text.encode())

    def read_bytes(self, uri: str) -> bytes:
        fs, path = self.fs(uri)
        return fs.cat_file(path)

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode()

    def exists(self, uri: str) -> bool:
        fs, path = self.fs(uri)
        return fs.exists(path)

    def list(self, uri: str) -> list[str]:
        """Names (not full URIs) directly under a prefix, sorted; [] when it does not exist."""
        fs, path = self.fs(uri)
        if not fs.exists(path):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))

    def walk_files(self, uri: str) -> Iterator[str]:
        """Every object under a prefix, as full URIs."""
        fs, path = self.fs(uri)
        prefix = uri[: len(uri) - len(path)] if "://" in uri else ""
        for p in sorted(fs.find(path)):
            yield prefix + p

    def delete(self, uri: str, recursive: bool = False) -> None:
        """Remove an object (or a prefix with recursive=True); missing is fine."""
        fs, path = self.fs(uri)
        if fs.exists(path):
            fs.rm(path, recursive=recursive)

    def makedirs(self, uri: str) -> None:
        fs, path = self.fs(uri)
        if scheme_of(uri) == "file":
            fs.makedirs(path, exist_ok=True)
