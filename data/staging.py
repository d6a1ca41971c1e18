"""Files and folders written under a name of this process's own beside their place, then renamed in.

Two runs may write the same cache file at once (a sweep's jobs, two terminals): each renames a
whole file of its own into place, so no reader meets half of one and neither trips over the
other's. A run killed while it writes leaves its staging name behind; the next run on the same
machine to write the same path removes it once that process is gone. The name holds the machine's
host name as well as the process id: a cache folder shared with other machines (NFS) or other
containers sees their writers' ids, which say nothing here, so their names are left alone.
"""

import glob
import os
import shutil
import socket
from pathlib import Path

STAGING_INFIX = ".tmp-"  # then the writer's host name, a dash and its process id


def staging_path(path: Path) -> Path:
    """Where this process writes path before renaming it into place: beside it, on one filesystem."""
    return path.with_name(f"{path.name}{STAGING_INFIX}{socket.gethostname()}-{os.getpid()}")


def write_staged(path: Path, payload: bytes | str) -> None:
    """payload written to path whole or not at all: a write that fails half-way (a full disk) leaves
    nothing, and what killed writers of path left is removed first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_staging(path)
    staging = staging_path(path)
    try:
        if isinstance(payload, str):
            staging.write_text(payload)
        else:
            staging.write_bytes(payload)
        staging.replace(path)
    finally:
        staging.unlink(missing_ok=True)


def remove_abandoned_staging(path: Path) -> None:
    """The staging files and folders that processes of this machine left at path's side when they
    were killed writing it (they are gone); never another machine's, nor a live process's."""
    prefix = f"{path.name}{STAGING_INFIX}"
    for staging in path.parent.glob(f"{glob.escape(prefix)}*"):
        host, _, pid = staging.name.removeprefix(prefix).rpartition("-")
        if host != socket.gethostname() or not pid.isdigit() or process_is_alive(int(pid)):
            continue
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.unlink(missing_ok=True)


def process_is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: delivers nothing, only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True
