"""What identifies a request's spans, whatever its encoding and whichever decoder read it: a redelivery of the
same spans has the same digest. Apart from the Arrow rows so that a decode worker computes it without pyarrow."""

from __future__ import annotations

import hashlib


def ids_digest(ids: list[bytes]) -> bytes:
    """128 bits of BLAKE2b over the sorted hex trace id + span id of every span, one per line (the digests
    already stored were made this way: it must not change)."""
    return hashlib.blake2b(b"\n".join(sorted(ids)), digest_size=16).digest()
