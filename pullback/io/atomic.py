"""Atomic file replacement: a reader sees the old file or the new one, never a mix.

The bytes go to a temporary file in the target's directory (so `os.replace` is a
rename within one filesystem), are flushed to disk, and only then renamed onto the
target; the directory is synced so the rename itself survives a power cut.
"""

from __future__ import annotations

import contextlib
import os
import secrets

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


def atomic_write(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Replace the file at `path` by `data` atomically.

    On any failure (including KeyboardInterrupt) the temporary file is removed and
    whatever was at `path` before is left untouched.
    """
    target = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(target)
    # A dot-prefixed random name keeps concurrent writers apart and out of `ls`.
    temporary = os.path.join(
        directory, f".{os.path.basename(target)}.{secrets.token_hex(6)}.tmp"
    )
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    # Mode 0o666 lets the umask decide permissions, as an ordinary open() would.
    fd = os.open(temporary, flags, 0o666)
    try:
        try:
            _write_all(fd, memoryview(data).cast("B"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    _fsync_directory(directory)
