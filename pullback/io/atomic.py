"""Atomic file replacement: a reader sees the old file or the new one, never a mix.

The bytes go to a temporary file in the target's directory (so `os.replace` is a
rename within one filesystem), are flushed to disk, and only then renamed onto the
target; the directory is synced so the rename itself survives a power cut.

A writer holds an exclusive `flock` on its temporary file until the rename, so the
next write to a folder can tell a temporary file that a killed writer left behind
(nobody holds its lock) from one being written, and removes the former. Windows has
no `flock`; there leftovers stay. `check_writable` probes a folder before long work.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

# Large writes go out in pieces: some platforms cap a single os.write, and a short
# write must be resumed rather than mistaken for completion.
_CHUNK = 64 * 1024 * 1024


def _write_all(fd: int, data: memoryview) -> None:
    """Write every byte of `data` to `fd`, resuming after short writes."""
    offset = 0
    while offset < len(data):
        offset += os.write(fd, data[offset : offset + _CHUNK])


def _fsync_directory(directory: str) -> None:
    # Windows cannot open a directory as a file, and its rename is already durable
    # enough for NTFS; elsewhere the directory entry must be synced separately.
    if os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        # Some filesystems (network mounts, tmpfs variants) refuse fsync on a
        # directory; the rename has happened, so there is nothing left to undo.
        pass
    finally:
        os.close(fd)


# The names atomic_write and check_writable give their temporary files.
_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")


def _temporary_name(directory: str, basename: str) -> str:
    # A dot-prefixed random name keeps concurrent writers apart and out of `ls`.
    return os.path.join(directory, f".{basename}.{secrets.token_hex(6)}.tmp")


def remove_abandoned(directory: str) -> None:
    """Remove the temporary files in `directory` whose writer is gone (no lock on them)."""
    if fcntl is None:
        return
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for entry in names:
        if not _TEMPORARY.fullmatch(entry):
            continue
        path = os.path.join(directory, entry)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue  # gone already, or not ours to open
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live writer holds it
            with contextlib.suppress(OSError):
                os.remove(path)
        finally:
            os.close(fd)


def _create_locked(directory: str, basename: str) -> tuple[int, str]:
    """A new temporary file, open for writing and (where flock exists) locked by us."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        temporary = _temporary_name(directory, basename)
        # Mode 0o666 lets the umask decide permissions, as an ordinary open() would.
        fd = os.open(temporary, flags, 0o666)
        if fcntl is None:
            return fd, temporary
        fcntl.flock(fd, fcntl.LOCK_EX)
        # A cleaner may have taken the file for abandoned between its creation and our
        # lock; then the name is gone (or another file's) and we start over.
        with contextlib.suppress(OSError):
            if os.path.samestat(os.stat(temporary), os.fstat(fd)):
                return fd, temporary
        os.close(fd)


def check_writable(directory: str | os.PathLike[str]) -> None:
    """Raise `PermissionError` (or another OSError) unless a file can be made in
    `directory`: the permission bits are asked first, then a file is created and
    removed, which also catches what the bits do not say (read-only mounts, ACLs)."""
    folder = os.fspath(directory)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), folder)
    probe = _temporary_name(folder, "pullback-probe")
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    os.remove(probe)


def atomic_write(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Replace the file at `path` by `data` atomically.

    On any failure (including KeyboardInterrupt) the temporary file is removed and
    whatever was at `path` before is left untouched. Temporary files that killed
    writers left in the folder are removed first.
    """
    target = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(target)
    remove_abandoned(directory)
    fd, temporary = _create_locked(directory, os.path.basename(target))
    closed = False
    try:
        try:
            _write_all(fd, memoryview(data).cast("B"))
            os.fsync(fd)
        finally:
            if fcntl is None:
                # Windows cannot rename an open file; without flock there is no lock
                # to keep anyway.
                os.close(fd)
                closed = True
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    finally:
        # Closing releases the lock, only now that the name is the target's.
        if not closed:
            os.close(fd)
    _fsync_directory(directory)
