"""Local files of resource tasks: read and written only under one root directory.

The root is explicit (``ResourceWorker(base_dir=...)``, ``--base-dir``), else
``$XDG_DATA_HOME/flowstream/resources`` — never the current directory, which
for a long-running worker is an accident of how it was started.

A URI names a path relative to the root (``data/in.json``, ``file:data/in.json``;
an absolute path is accepted only if it lies under the root). ``..`` is refused
outright rather than resolved, so what a flow names is what is opened.

Every open walks the path one component at a time from a descriptor of the
root, with ``O_NOFOLLOW``: a symlink swapped in between a check and the open
cannot redirect it. Sources may read through symlinks that stay inside the root
(the path is resolved first, checked, then walked without following); sinks
never follow or replace a symlink, refuse hidden and code files, and write a
temporary file beside the target that is renamed over it. POSIX only (``dir_fd``).
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath

from workers.errors import ResourceError

__all__ = ["default_base_dir", "read_file", "relative_path", "write_file"]

# Sinks never write what a Python process, a dynamic loader or a shell would run,
# so a flow cannot plant code in a directory that is also on a path.
_CODE_SUFFIXES = frozenset({".py", ".pyc", ".pth", ".so", ".dll", ".dylib", ".sh"})
_VERSIONED_LIBRARY = re.compile(r"\.so(\.\d+)+$", re.IGNORECASE)  # libx.so.1.2
_CHUNK = 1 << 16


def default_base_dir() -> Path:
    """``$XDG_DATA_HOME/flowstream/resources``, with the XDG default ``~/.local/share``
    (a relative ``XDG_DATA_HOME`` is ignored, as the specification says)."""
    data_home = os.environ.get("XDG_DATA_HOME", "")
    base = Path(data_home) if os.path.isabs(data_home) else Path.home() / ".local" / "share"
    return base / "flowstream" / "resources"


def relative_path(uri: str, root: Path) -> PurePosixPath:
    """The path ``uri`` names, relative to ``root`` (already resolved); ResourceError if it
    is not a local path, contains ``..``, or is absolute outside the root."""
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ResourceError(f"{uri}: file URI names host {parts.netloc!r} (expected none)")
        raw = urllib.parse.unquote(parts.path)
    elif scheme:
        raise ResourceError(
            f"{uri}: unsupported URI scheme {scheme!r} (expected a path, file:, http: or https:)"
        )
    else:
        raw = uri
    if "\0" in raw:
        raise ResourceError(f"{uri}: path contains a NUL byte")
    path = PurePosixPath(raw)
    if ".." in path.parts:
        raise ResourceError(f"{uri}: '..' is not allowed (paths stay under {root})")
    if path.is_absolute():
        if not path.is_relative_to(root):
            raise ResourceError(f"{uri}: absolute path outside the base directory {root}")
        path = path.relative_to(root)
    if not path.parts:
        raise ResourceError(f"{uri}: names the base directory itself, not a file")
    return path


def _sink_refusal(path: PurePosixPath) -> str | None:
    """Why a sink may not write ``path``, or None."""
    hidden = next((part for part in path.parts if part.startswith(".")), None)
    if hidden is not None:
        return f"hidden name {hidden!r} (sinks write no dotfiles or dot-directories)"
    name = path.name
    suffix = PurePosixPath(name).suffix.lower()
    if suffix in _CODE_SUFFIXES or _VERSIONED_LIBRARY.search(name):
        listed = ", ".join(sorted(_CODE_SUFFIXES))
        return f"code file {name!r} (sinks write no {listed})"
    return None


def _open_dir(name: str, parent: int, uri: str, create: bool) -> int:
    """A descriptor of directory ``name`` in ``parent``, never through a symlink."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
        # FileExistsError: another worker made it meanwhile; the open below checks what it is.
        with suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=parent)
        return os.open(name, flags, dir_fd=parent)
    except OSError as error:
        if _is_symlink(name, parent):
            raise ResourceError(f"{uri}: {name!r} is a symlink (not followed)") from error
        raise


def _is_symlink(name: str, parent: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode)
    except OSError:
        return False


@contextmanager
def _directory(root: Path, parts: tuple[str, ...], uri: str, create: bool) -> Iterator[int]:
    """A descriptor of ``root/parts...``, each component opened without following symlinks."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            child = _open_dir(part, fd, uri, create)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def read_file(uri: str, root: Path, limit: int) -> bytes:
    """The bytes of the file ``uri`` names under ``root``, at most ``limit`` of them.

    Symlinks are followed only as far as they stay under the root: the path is
    resolved, checked, then opened component by component without following."""
    relative = relative_path(uri, root)
    resolved = (root / relative).resolve()
    if not resolved.is_relative_to(root):
        raise ResourceError(f"{uri}: resolves to {resolved}, outside the base directory {root}")
    inside = resolved.relative_to(root).parts
    if not inside:
        raise ResourceError(f"{uri}: names the base directory itself, not a file")
    try:
        with _directory(root, inside[:-1], uri, create=False) as parent:
            # O_NONBLOCK: opening a FIFO must not hang the worker; regular files ignore it.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            fd = os.open(inside[-1], flags, dir_fd=parent)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise ResourceError(f"{uri}: {resolved} is not a regular file")
                if info.st_size > limit:
                    raise ResourceError(
                        f"{uri}: {info.st_size:,} bytes, more than the limit of {limit:,}"
                    )
                data = _read_up_to(fd, limit + 1)  # the file may have grown since fstat
            finally:
                os.close(fd)
    except ResourceError:
        raise
    except OSError as error:
        if error.errno == getattr(os, "ELOOP", -1):
            raise ResourceError(f"{uri}: {resolved} became a symlink (not followed)") from error
        raise ResourceError(f"{uri}: cannot read {resolved}: {error.strerror}") from error
    if len(data) > limit:
        raise ResourceError(f"{uri}: more than the limit of {limit:,} bytes")
    return data


def _read_up_to(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.read(fd, min(size, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def write_file(uri: str, root: Path, body: bytes) -> Path:
    """Store ``body`` as the file ``uri`` names under ``root`` (made if missing); the
    path written. A temporary file beside the target is renamed over it, so a reader
    sees the old file or the new one, never half of one."""
    relative = relative_path(uri, root)
    refusal = _sink_refusal(relative)
    if refusal is not None:
        raise ResourceError(f"{uri}: refused: {refusal}")
    target = root / relative
    name = relative.name
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _directory(root, relative.parts[:-1], uri, create=True) as parent:
            try:
                existing = os.lstat(name, dir_fd=parent)
            except FileNotFoundError:
                existing = None
            if existing is not None and not stat.S_ISREG(existing.st_mode):
                what = "a symlink" if stat.S_ISLNK(existing.st_mode) else "not a regular file"
                raise ResourceError(f"{uri}: {target} is {what}; not replaced")
            temporary = f".{name}.{secrets.token_hex(6)}.tmp"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temporary, flags, 0o644, dir_fd=parent)
            try:
                with os.fdopen(fd, "wb") as file:
                    file.write(body)
                    file.flush()
                    os.fsync(file.fileno())
                os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                with suppress(OSError):
                    os.unlink(temporary, dir_fd=parent)
                raise
    except ResourceError:
        raise
    except OSError as error:
        raise ResourceError(f"{uri}: cannot write {target}: {error.strerror}") from error
    return target
