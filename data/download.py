"""Downloads that fail fast and keep nothing they cannot vouch for.

    fetch_verified(url, sha256, destination, offline_advice, mismatch_advice)
        Download url with a short timeout; write it to destination (atomically) only if
        its sha256 is the expected one. Any failure is one UserError line that says what
        happened and, from the advice given, what to do instead.
    sha256_of(payload) -> str
"""

import hashlib
import urllib.request
from pathlib import Path

from data.staging import remove_abandoned_staging, write_staged
from user_error import UserError

TIMEOUT_S = 15.0  # per connection attempt and per read, not for the whole file


def fetch_verified(url: str, sha256: str, destination: Path, offline_advice: str, mismatch_advice: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            payload = response.read()
    except (OSError, ValueError) as err:  # no network, refused, timed out, HTTP error, bad URL
        reason = getattr(err, "reason", None) or err
        raise UserError(f"could not download {url} ({reason}); {offline_advice}") from None
    actual = sha256_of(payload)
    if actual != sha256:
        raise UserError(f"{url} has sha256 {actual}, not the expected {sha256}; nothing was kept. {mismatch_advice}")
    remove_abandoned_staging(destination)
    write_staged(destination, payload)


def sha256_of(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()
