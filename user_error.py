"""UserError: what any part of the project raises when a user asked for something it cannot do.

Its message is one line: what is wrong, with which value, and what to do. The commands print
it as "error: <message>" and exit 2 (cli/errors.py). It lives here, on the ground floor,
so that data/ and model/ can raise it without importing the training loop's package.
"""


class UserError(Exception):
    """Something the user asked for cannot be done; the message says what and how to fix it."""
