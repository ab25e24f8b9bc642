"""Test-only disks for the disk faults: a file system filled to its last byte (full disk), and a
small ext4 file system on a loop device whose writes are throttled (slow disk)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BLKIO = Path("/sys/fs/cgroup/blkio")
"""The cgroup v1 blkio hierarchy (its write throttles apply to the processes of a cgroup)."""


def fill(where: Path) -> Path:
    """Fill the file system of ``where`` to the last byte; delete the returned file to free it."""
    filler = where / f"filler-{uuid.uuid4().hex}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (65536, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


@dataclass(frozen=True)
class SlowDisk:
    """A mounted file system whose writes, by the processes in ``cgroup``, are throttled."""

    mount: Path
    cgroup: Path
    iops: int
    """Write operations per second the throttle allows."""
    bps: int
    """Bytes written per second the throttle allows."""

    def enter(self, pid: int) -> None:
        """Move process ``pid`` (all its threads, and the threads it starts later) into the cgroup."""
        (self.cgroup / "cgroup.procs").write_text(f"{pid}\n")


def slow_disk_unavailable() -> str | None:
    """Why ``slow_disk`` cannot be set up here (None when it can)."""
    if os.geteuid() != 0:
        return "a throttled loop device needs root"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian packages mount, e2fsprogs)"
    if not (BLKIO / "blkio.throttle.write_iops_device").exists():
        return f"no cgroup v1 blkio hierarchy with write throttles at {BLKIO}"
    return None


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


@contextmanager
def slow_disk(where: Path, *, iops: int, bps: int, size_mb: int = 128) -> Iterator[SlowDisk]:
    """An ext4 file system of ``size_mb`` MB on a loop device (direct I/O, backed by a file in
    ``where``), mounted at ``where/mnt``; a blkio cgroup throttles the writes its processes make
    to it to ``iops`` operations and ``bps`` bytes per second (``SlowDisk.enter`` a process).
    The ext4 journal's own commits (a kernel thread) are not throttled. Raises OSError when a
    step fails (``slow_disk_unavailable`` names the usual reasons first)."""
    backing, mount = where / "disk.img", where / "mnt"
    mount.mkdir()
    with open(backing, "wb") as fh:
        fh.truncate(size_mb * 2**20)
    loop = _run("losetup", "--find", "--show", "--direct-io=on", str(backing))
    cgroup = BLKIO / f"cliptrack-slow-{uuid.uuid4().hex[:12]}"
    mounted = False
    try:
        _run("mkfs.ext4", "-q", "-F", loop)
        _run("mount", loop, str(mount))
        mounted = True
        device = Path(f"/sys/block/{Path(loop).name}/dev").read_text().strip()  # major:minor
        cgroup.mkdir()
        (cgroup / "blkio.throttle.write_iops_device").write_text(f"{device} {iops}\n")
        (cgroup / "blkio.throttle.write_bps_device").write_text(f"{device} {bps}\n")
        yield SlowDisk(mount, cgroup, iops, bps)
    finally:
        if cgroup.exists():
            for pid in (cgroup / "cgroup.procs").read_text().split():  # leftovers back to the root
                try:
                    (BLKIO / "cgroup.procs").write_text(f"{pid}\n")
                except OSError:
                    pass
            cgroup.rmdir()
        if mounted:
            subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
        subprocess.run(["losetup", "-d", loop], check=False, capture_output=True)
