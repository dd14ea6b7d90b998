"""Where runs live: a local folder or an object-store URL (gs://, s3://, memory://), through one layer.

Every table part, manifest, dead letter, report and policy location goes through `location()`: a local path
stays a `pathlib.Path` (atomic temp-file + rename, as before); a URL becomes a `upath.UPath` over the URL
scheme's fsspec filesystem (gcsfs, s3fs, ...). Object stores have no rename, so `write_file` uploads each file
to its final name in one request: an object appears whole or not at all, and a rerun that writes the same
bytes to the same name is idempotent. Credentials and endpoints come from the filesystem's own settings
(gcsfs: Application Default Credentials or `STORAGE_EMULATOR_HOST`; s3fs: the AWS variables; any fsspec
option as `FSSPEC_<PROTOCOL>_<OPTION>`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Union

from upath import UPath

Location = Union[Path, UPath]  # noqa: UP007 (a runtime alias)

CACHE_ENV = "DIDPO_CACHE"  # where remote checkpoints are copied and remote outputs are staged


def is_url(path: Any) -> bool:
    """True for an object-store URL (`scheme://...`), False for a local path (`file://` counts as local)."""
    text = str(path)
    return "://" in text and not text.startswith("file://")


def location(path: str | os.PathLike | UPath) -> Location:
    """A path as the one type the project passes around: `Path` for local paths, `UPath` for URLs.

    Remote listings are never cached: parts are written by other processes (Beam workers), so a cached
    listing would miss them.
    """
    if isinstance(path, UPath) and is_url(path):
        return path
    text = str(path)
    if text.startswith("file://"):
        return Path(text[len("file://"):])
    if not is_url(text):
        return Path(text)
    _quiet_emulator_probe()
    return UPath(text, use_listings_cache=False)


def _quiet_emulator_probe() -> None:
    # gcsfs's experimental zonal/HNS layer asks every bucket its type over gRPC with TLS; an emulator
    # (STORAGE_EMULATOR_HOST: plain HTTP) cannot answer, and each probe stalls 60 s. Off under an emulator.
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def makedirs(path: Location) -> None:
    """Create a local folder (and its parents); object stores have no folders, so nothing to do there."""
    if isinstance(path, Path):
        path.mkdir(parents=True, exist_ok=True)


def remove_tree(path: Location) -> None:
    """Remove a folder and everything under it, if it exists."""
    if isinstance(path, Path):
        if path.exists():
            shutil.rmtree(path)
    elif path.exists():
        path.fs.rm(path.path, recursive=True)


def write_file(dest: Location, write: Callable[[str], Any]) -> None:
    """Write `dest` so that readers see all of it or nothing: `write(tmp)` fills a local temp file, which is
    then renamed into place (local: same folder, fsync first) or uploaded in one request (object store)."""
    if isinstance(dest, Path):
        _atomic_local(dest, write)
        return
    with tempfile.TemporaryDirectory(prefix=".didpo-upload.") as tmpdir:
        tmp = os.path.join(tmpdir, dest.name)
        write(tmp)
        dest.fs.put_file(tmp, dest.path)


def _atomic_local(dest: Path, write: Callable[[str], Any]) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def open_input(path: Location) -> Any:
    """Something pyarrow reads: the path itself when local, an fsspec file object when remote."""
    return str(path) if isinstance(path, Path) else path.open("rb")


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "didpo")


def _listing(url: UPath) -> list[tuple[str, int, str]]:
    """(relative name, size, version tag) of every object under a remote folder, sorted."""
    base = url.path.rstrip("/")
    out = []
    for name, info in url.fs.find(url.path, detail=True).items():
        tag = next((str(info[k]) for k in ("etag", "ETag", "md5Hash", "generation", "mtime", "LastModified")
                    if info.get(k) is not None), "")
        out.append((name[len(base) + 1:], int(info.get("size") or 0), tag))
    return sorted(out)


def local_copy(path: str | os.PathLike | UPath) -> Path:
    """A local folder holding `path`'s files: `path` itself when local; for a URL, a copy in the cache keyed by
    the URL and its objects' names, sizes and version tags (a changed object downloads again). Checkpoint
    loaders (transformers, vLLM, DeepSpeed) read local files only."""
    src = location(path)
    if isinstance(src, Path):
        return src
    listing = _listing(src)
    if not listing:
        raise FileNotFoundError(f"{src}: no such folder (no objects under it)")
    key = hashlib.sha256(repr((str(src), listing)).encode()).hexdigest()[:20]
    dest = cache_root() / "remote" / f"{src.name}-{key}"
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for name, _, _ in listing:
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            src.fs.get_file(f"{src.path.rstrip('/')}/{name}", str(staging / name))
        os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def work_dir(path: str | os.PathLike | UPath) -> Path:
    """A local folder standing in for a remote output while it is written (and resumed): the same URL gets the
    same folder, so a killed job picks up its local state. `path` itself when local."""
    dest = location(path)
    if isinstance(dest, Path):
        return dest
    key = hashlib.sha256(str(dest).encode()).hexdigest()[:20]
    return cache_root() / "staging" / f"{dest.name}-{key}"


def put_folder(local: Path, dest: UPath, *, exclude: tuple[str, ...] = (), last: tuple[str, ...] = ()) -> None:
    """Upload a local folder's files under `dest`. Top-level names in `exclude` stay behind; those in `last`
    go up after everything else: the commit point a reader checks (a report written after the weights)."""
    files = sorted(p for p in local.rglob("*") if p.is_file() and p.relative_to(local).parts[0] not in exclude)
    for file in sorted(files, key=lambda f: f.relative_to(local).parts[0] in last):
        dest.fs.put_file(str(file), f"{dest.path.rstrip('/')}/{file.relative_to(local).as_posix()}")


@contextmanager
def output_folder(path: str | os.PathLike | UPath, *, exclude: tuple[str, ...] = (),
                  last: tuple[str, ...] = ()) -> Iterator[Path]:
    """A local folder to write an output into: `path` itself when local; for a URL, a staging folder
    (`work_dir`) uploaded (`put_folder`) when the block completes without an error."""
    dest = location(path)
    local = work_dir(dest)
    yield local
    if not isinstance(dest, Path):
        put_folder(local, dest, exclude=exclude, last=last)
