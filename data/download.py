"""Downloads that fail fast and keep nothing they cannot vouch for.

    verified_copy(url, sha256, destination, offline_advice, mismatch_advice) -> destination
        The file destination, if it is there with that sha256; else url downloaded with a
        short timeout and written there (atomically) only if its sha256 is the expected one.
        Any failure is one UserError line that says what happened and, from the advice
        given, what to do instead.
    check_sha256(payload, expected, where, advice)
        UserError unless payload has the sha256 expected.
"""

import hashlib
import urllib.request
from pathlib import Path

from data.staging import write_staged
from user_error import UserError

TIMEOUT_S = 15.0  # per connection attempt and per read, not for the whole file


def verified_copy(url: str, sha256: str, destination: Path, offline_advice: str, mismatch_advice: str) -> Path:
    if destination.is_file() and sha256_of(destination.read_bytes()) == sha256:
        return destination  # fetched before
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            payload = response.read()
    except (OSError, ValueError) as err:  # no network, refused, timed out, HTTP error, bad URL
        reason = getattr(err, "reason", None) or err
        raise UserError(f"could not download {url} ({reason}); {offline_advice}") from None
    check_sha256(payload, sha256, url, f"nothing was kept. {mismatch_advice}")
    write_staged(destination, payload)
    return destination


def check_sha256(payload: bytes, expected: str, where: str, advice: str) -> None:
    actual = sha256_of(payload)
    if actual != expected:
        raise UserError(f"{where} has sha256 {actual}, not the expected {expected}; {advice}")


def sha256_of(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()
