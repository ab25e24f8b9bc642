"""The spool directory a reader is given (``--jsonl DIR``), checked: a path that is not a directory
is named for what it is, with the flag that reads it, as an absolute path."""

from __future__ import annotations

from pathlib import Path

SQLITE_HEADER = b"SQLite format 3\x00"


def what_file(path: Path) -> str:
    """A file's kind in words, with the option that reads it (by its first bytes and its name)."""
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError:
        head = b""
    where = path.resolve()
    if head == SQLITE_HEADER:
        return f"an SQLite database (an MLflow store? read it with --tracking-uri sqlite:///{where})"
    if path.suffix == ".wandb":
        return f"a W&B transaction log (read its run folder's parent with --wandb-dir {where.parent.parent})"
    if path.name == "run.json" or path.suffix == ".jsonl":
        return f"a file of one spooled run (the spool is the folder above its run: --jsonl {where.parent.parent})"
    return "a file"


def spool_directory(directory: str | Path) -> Path:
    """``directory`` as a Path, checked to be a directory (FileNotFoundError naming it, absolute,
    and what it is when it is a file)."""
    path = Path(directory)
    if path.is_dir():
        return path
    if path.is_file():
        raise FileNotFoundError(
            f"{str(path.resolve())!r} is {what_file(path)}, not a JSONL spool directory (--jsonl reads a "
            "folder of run folders)"
        )
    raise FileNotFoundError(f"JSONL spool directory {str(path.resolve())!r} does not exist")
