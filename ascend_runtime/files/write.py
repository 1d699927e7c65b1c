"""Writing inside an output directory without ever following a symbolic link planted in it.

A command that writes a tree (``render --out DIR``, ``up``'s state directory, ``balance record``'s dump
directory) opens the directory once and reaches every path below it one component at a time, relative to
the open directory (``dir_fd``) and with ``O_NOFOLLOW``. So:

- a symbolic link where a directory of the tree goes (``DIR/launch -> /etc``) is refused, naming it and
  where it points (:class:`OutputRefused`): nothing is written through it;
- a symbolic link where a file goes (``DIR/plan.json -> /etc/passwd``) is replaced by the new file: each
  file is written to a temporary file created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` beside it and renamed
  over the name, and ``rename(2)`` replaces a link, never its target;
- a removal (a stale file of an earlier render) unlinks the name itself, never a link's target, and never
  below a link.

The output directory itself is the operator's choice and may be a link to a directory.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path, PurePosixPath
from types import TracebackType

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW_DIR = _DIR_FLAGS | os.O_NOFOLLOW


class OutputRefused(ValueError):
    """A path inside an output directory the kit will not write through (its message names it and the fix)."""


class OutputDir:
    """The directory ``path`` (created with its parents when missing), held open; paths given to its
    methods are relative to it, ``/``-separated, without ``..``."""

    def __init__(self, path: Path | str, mode: int = 0o755) -> None:
        self.path = Path(path)
        try:
            self.path.mkdir(mode=mode, parents=True, exist_ok=True)
            self.fd = os.open(self.path, _DIR_FLAGS)
        except FileExistsError:
            raise OutputRefused(f"{self.path} is not a directory; name a new or existing folder") from None
        except NotADirectoryError:
            raise OutputRefused(f"{self.path} is not a directory; name a new or existing folder") from None

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Release the directory's descriptor."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # --- reaching a path --------------------------------------------------------------------------

    @staticmethod
    def _parts(rel: str) -> tuple[str, ...]:
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts or "." in parts:
            raise ValueError(f"not a path inside the output directory: {rel!r}")
        return parts

    def _open_dirs(self, parts: tuple[str, ...], create: bool) -> int | None:
        """A descriptor of the directory ``parts`` below the output directory (created when ``create``), or
        None when it is missing and not created; OutputRefused for a link or a non-directory on the way."""
        fd = os.dup(self.fd)
        shown = self.path
        try:
            for part in parts:
                shown = shown / part
                try:
                    nxt = _enter(part, fd, shown)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass  # made meanwhile: entered below like any other
                    nxt = _enter(part, fd, shown)
                os.close(fd)
                fd = nxt
            return fd
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise

    # --- writing ------------------------------------------------------------------------------------

    def ensure_dir(self, rel: str) -> Path:
        """The directory ``rel`` below the output directory, created when missing; a link on the way is refused."""
        fd = self._open_dirs(self._parts(rel), create=True)
        assert fd is not None
        os.close(fd)
        return self.path / rel

    def write(self, rel: str, data: bytes | str, mode: int = 0o644) -> Path:
        """Write ``data`` (text as UTF-8) to ``rel`` with permission bits ``mode``: a temporary file in the same
        directory, renamed over the name (a link there is replaced, never followed). Returns the path."""
        parts = self._parts(rel)
        fd = self._open_dirs(parts[:-1], create=True)
        assert fd is not None
        name = parts[-1]
        tmp = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as fh:
                    fh.write(data.encode() if isinstance(data, str) else data)
                    fh.flush()
                    os.fchmod(fh.fileno(), mode)
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except IsADirectoryError:
                _unlink_quietly(tmp, fd)
                raise OutputRefused(f"{self.path / rel} is a directory, where a file of the output goes; remove it, "
                                    "or give another folder") from None
            except BaseException:
                _unlink_quietly(tmp, fd)
                raise
        finally:
            os.close(fd)
        return self.path / rel

    def create(self, rel: str, mode: int = 0o644, append: bool = False, exclusive: bool = False) -> int:
        """An open write-only descriptor of ``rel`` (a log, a secret): a link at the name is removed first and the
        file opened with ``O_NOFOLLOW``; truncated unless ``append``; ``exclusive`` also removes a regular file
        there and creates it anew (never reusing a file a wider mode may have exposed)."""
        parts = self._parts(rel)
        fd = self._open_dirs(parts[:-1], create=True)
        assert fd is not None
        name = parts[-1]
        try:
            try:
                info = os.lstat(name, dir_fd=fd)
                if stat.S_ISLNK(info.st_mode) or (exclusive and stat.S_ISREG(info.st_mode)):
                    os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            flags |= os.O_EXCL if exclusive else (os.O_APPEND if append else os.O_TRUNC)
            try:
                return os.open(name, flags, mode, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise OutputRefused(f"{self.path / rel} is not a regular file (a link made meanwhile, a directory, "
                                        "a FIFO or a socket); remove it") from None
                raise
        finally:
            os.close(fd)

    def rename(self, rel: str, new_rel: str) -> bool:
        """Rename ``rel`` to ``new_rel`` in the same directory (a link is renamed, not followed); False when
        ``rel`` does not exist."""
        parts, new_parts = self._parts(rel), self._parts(new_rel)
        if parts[:-1] != new_parts[:-1]:
            raise ValueError("rename within one directory only")
        fd = self._open_dirs(parts[:-1], create=False)
        if fd is None:
            return False
        try:
            os.replace(parts[-1], new_parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)

    # --- removing -----------------------------------------------------------------------------------

    def remove(self, rel: str) -> bool:
        """Unlink the file or link ``rel`` and the directories it leaves empty (up to the output directory);
        False when it is not there, is a directory, or lies below a link (nothing is removed through one)."""
        parts = self._parts(rel)
        try:
            fd = self._open_dirs(parts[:-1], create=False)
        except OutputRefused:
            return False
        if fd is None:
            return False
        try:
            try:
                if stat.S_ISDIR(os.lstat(parts[-1], dir_fd=fd).st_mode):
                    return False
                os.unlink(parts[-1], dir_fd=fd)
            except FileNotFoundError:
                return False
        finally:
            os.close(fd)
        self._prune(parts[:-1])
        return True

    def _prune(self, parts: tuple[str, ...]) -> None:
        """Remove the directories ``parts``, deepest first, while they are empty."""
        for depth in range(len(parts), 0, -1):
            fd = self._open_dirs(parts[: depth - 1], create=False)
            if fd is None:
                return
            try:
                os.rmdir(parts[depth - 1], dir_fd=fd)
            except OSError:
                return
            finally:
                os.close(fd)


def _enter(part: str, dir_fd: int, shown: Path) -> int:
    """A descriptor of the directory ``part`` under ``dir_fd``, never through a link (OutputRefused)."""
    try:
        return os.open(part, _NOFOLLOW_DIR, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refusal(dir_fd, part, shown) from None
        raise


def _refusal(dir_fd: int, name: str, shown: Path) -> OutputRefused:
    """Why ``name`` under ``dir_fd`` (shown as ``shown``) cannot be entered as a directory of the output."""
    try:
        info = os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return OutputRefused(f"{shown} cannot be entered; check the folder")
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        return OutputRefused(f"{shown} is a symbolic link (to {target[:200]}), where a folder of the output goes; "
                             "nothing is written through a link: remove it, or give another folder")
    return OutputRefused(f"{shown} is not a directory, where a folder of the output goes; remove it, or give "
                         "another folder")


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def write_file(path: Path | str, data: bytes | str, mode: int = 0o644) -> Path:
    """Write one file by temporary file and rename in its own directory (created when missing): a link at
    ``path`` is replaced by the file, never written through."""
    path = Path(path)
    with OutputDir(path.parent) as out:
        return out.write(path.name, data, mode)
