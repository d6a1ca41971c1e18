"""The error the data package raises for bad input: the CLIs print its message as one line."""


class DataError(ValueError):
    """A corpus, path or text the data pipeline cannot use; the message says what to do."""
