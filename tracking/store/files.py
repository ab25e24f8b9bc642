"""A store's files read back (run.json, acknowledgements, points.jsonl): regular files only.

A FIFO, a device, a socket or a directory where a store keeps a file (or a symlink to one: a
``points.jsonl`` linked to ``/dev/zero`` or to a pipe) is refused with a ``SpecialFileError``
naming the path and what it is. The kind is checked with ``os.stat`` before the file is opened and
again on the open descriptor, which is opened ``O_NONBLOCK`` so that opening a FIFO never waits
for a writer; nothing is ever read from a special file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from cliptrack.core.text import printable

__all__ = ["SpecialFileError", "open_regular"]


class SpecialFileError(ValueError):
    """A store file that is not a regular file (FIFO, device, socket, directory)."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path: Path, mode: int) -> SpecialFileError:
    return SpecialFileError(
        f"{printable(path)} is {_kind(mode)}, not a regular file: refused (a store's files are "
        "read only when they are regular files)"
    )


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading bytes when it is a regular file (a symlink to one too);
    ``SpecialFileError`` otherwise, ``FileNotFoundError`` when it does not exist."""
    path = Path(path)
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _refuse(path, mode)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced between the stat and the open
            raise _refuse(path, mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def lock_held(path: str | os.PathLike[str]) -> bool | None:
    """Whether a live process holds an advisory lock (``flock``) on the file at ``path``; read-only:
    the file is neither made nor changed, the lock is tried shared and let go at once. False when
    there is no such file; None where advisory locks are not there or the file cannot be opened."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here (Windows)
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
