"""Files and directories only their owner may use: the node's secrets and its local state.

A file holding a secret is created owner-only (0600) in the first place, never made private
after the fact: between a default-mode create and a later chmod any local user could open it and
keep the descriptor. A directory holding state is 0700. Existing installs from before this was
enforced are tightened by `tighten` / `tighten_tree`, which return what they changed so the
caller can say so.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

# The umask of every process that writes the node's state: group and others get nothing.
PRIVATE_UMASK = 0o077
FILE_MODE = 0o600
DIR_MODE = 0o700
# The files SQLite keeps beside a database (they take the database file's mode).
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_dir(path: Path) -> bool:
    """``path`` as a directory only its owner may enter: created 0700 (with any missing parents,
    also 0700) or, when it exists, stripped of group and other permissions.

    True when an existing directory had to be tightened."""
    if path.is_dir():
        return tighten(path)
    if not path.parent.is_dir():
        private_dir(path.parent)
    # The umask can only take permissions away from 0700.
    path.mkdir(mode=DIR_MODE, exist_ok=True)
    return tighten(path)


def write_private(path: Path, data: str | bytes, mode: int = FILE_MODE) -> None:
    """Replace ``path`` in one step with ``data``, in a file created with ``mode`` (owner-only by
    default): a reader never sees half a file, and nobody else ever sees it at all.

    The directory is created (0700) when missing; an existing one is left as it is."""
    if not path.parent.is_dir():
        private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    # A temporary file left by an interrupted run keeps its mode on open: start from nothing.
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def dump_private_yaml(data: Any, path: Path) -> None:
    """``data`` as YAML into an owner-only ``path`` (a registration, a homeserver or node
    configuration: they hold tokens and secrets)."""
    out = io.StringIO()
    YAML().dump(data, out)
    write_private(path, out.getvalue())


def open_private_append(path: Path) -> io.BufferedWriter:
    """``path`` opened for appending bytes, created owner-only when missing (a log that may hold
    tokens); an existing file keeps its mode (see `tighten`)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    return os.fdopen(fd, "ab")


def create_private_file(path: Path) -> bool:
    """Create ``path`` empty and owner-only unless it exists (so that whatever opens it next,
    e.g. SQLite, finds it private). True when it was created."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def tighten(path: Path) -> bool:
    """Take group and other permissions off ``path`` (not following a symbolic link).

    True when it had any; False when it had none or does not exist. An error (a file owned by
    someone else) is raised: the caller decides whether that stops it."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        return False
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o077:
        return False
    os.chmod(path, mode & ~0o077)
    return True


def tighten_all(paths: Iterable[Path]) -> tuple[list[Path], list[str]]:
    """`tighten` each of ``paths``: (those tightened, the problems met, one line each)."""
    changed: list[Path] = []
    problems: list[str] = []
    for path in paths:
        try:
            if tighten(path):
                changed.append(path)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
    return changed, problems


def _tree(root: Path) -> Iterable[Path]:
    # The root itself even when it is a symbolic link to the state (`var -> /data/rethink`).
    yield root.resolve()
    for directory, dirs, files in os.walk(root, followlinks=False):
        base = Path(directory)
        for name in (*dirs, *files):
            yield base / name


def tighten_tree(root: Path) -> tuple[list[Path], list[str]]:
    """Create ``root`` 0700 when missing; take group and other permissions off it and everything
    under it (symbolic links in it are neither followed nor changed). Returns (what was tightened,
    the problems met)."""
    if not root.is_dir():
        private_dir(root)
        return [], []
    return tighten_all(_tree(root))


def describe(changed: list[Path], limit: int = 5) -> str:
    """A short list of tightened paths for a log line."""
    shown = ", ".join(str(p) for p in changed[:limit])
    more = len(changed) - limit
    return shown + (f" and {more} more" if more > 0 else "")
