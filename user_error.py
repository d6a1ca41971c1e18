"""UserError: what any part of the project raises when a user asked for something it cannot do.

Its message is one line: what is wrong, with which value, and what to do. The commands print
it as "error: <message>" and exit 2 (cli/errors.py). It lives here, on the ground floor,
so that data/ and model/ can raise it without importing the training loop's package.
"""


import re
import shlex
import sys
from pathlib import Path


class UserError(Exception):
    """Something the user asked for cannot be done; the message says what and how to fix it."""


def quoted(value: str, limit: int = 80) -> str:
    """value as an error quotes it: repr'd, and cut to its first `limit` characters when longer, so
    that a message stays one short line whatever was sent."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value):,} characters)"


def as_typed(value: object) -> str:
    """A config value as the command line spells it: true, false and null, not Python's True, False, None."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def require(ok: bool, message: str) -> None:
    """A check of what a user asked for: UserError(message) unless ok."""
    if not ok:
        raise UserError(message)


def not_installed(missing: ModuleNotFoundError, script: str) -> str:
    """The one line a script says when run by a python without the packages `make setup` installs."""
    return (f"error: {missing.name} is not installed for this python ({sys.executable}); run .venv/bin/python {script} "
            "(make setup makes .venv), or activate .venv first")


def command_argument(key: str, value: str) -> str:
    """key=value as one argument of a command printed to be pasted into a shell: in Hydra's quotes
    where the value holds what Hydra's grammar reads otherwise (, = : ' ( [ { $, a letter outside
    ASCII), then in the shell's where it holds a space or a quote. run=outputs/<date>/<time> stays
    as it is; run=../my run becomes 'run=../my run'."""
    if not re.fullmatch(r"[A-Za-z0-9_./@+%*?|-]+( +[A-Za-z0-9_./@+%*?|-]+)*", value):
        value = '"' + value.replace('"', '\\"').replace("${", "\\${") + '"'  # OmegaConf then reads \${ as ${
    return shlex.quote(f"{key}={value}")


def not_a_file_or_folder(path: Path) -> str:
    """Why a path that is neither a folder nor a file cannot be read: not there, a link that leads
    nowhere, or a named pipe, a device."""
    if path.is_symlink() and not path.exists():
        return "is a link that leads nowhere (to a path that does not exist, or round in a loop)"
    return "is neither a file nor a folder" if path.exists() else "does not exist"
