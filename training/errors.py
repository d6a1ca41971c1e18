"""Mistakes a user can make get one clear line, a non-zero exit and no traceback.

    UserError             raised for bad config, paths, checkpoints or prompts
    exit_on_user_error()  wraps a CLI's work: prints "error: <message>" and exits 2
"""

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from data.errors import DataError


class UserError(Exception):
    """Something the user asked for cannot be done; the message says what and how to fix it."""


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    try:
        yield
    except (UserError, DataError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
