"""Who may use a path: the modes the tests of owner-only state check."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def exposed(root: Path) -> list[str]:
    """Everything under ``root`` (and root) that group or others may use: a directory that is
    not 0700, a file with any group or other permission (symbolic links have no mode of their
    own on Linux and are skipped)."""
    found = [] if mode(root) == 0o700 else [f"{root} {oct(mode(root))}"]
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = Path(directory, name)
            if path.is_symlink():
                continue
            if (mode(path) != 0o700) if path.is_dir() else bool(mode(path) & 0o077):
                found.append(f"{path} {oct(mode(path))}")
    return found
