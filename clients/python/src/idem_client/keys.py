"""Operation keys: UUIDv7 (RFC 9562), generated here from the wall clock and the OS's randomness.

A UUIDv7 orders by creation time (its first 48 bits are Unix milliseconds), carries 74 random bits, and
fits idemd's default key policy (8..255 characters of ``A-Z a-z 0-9 - _ . :``).
"""

from __future__ import annotations

import os
import re
import time
from typing import Callable

__all__ = ["new_key", "is_uuid7", "valid_key"]

_UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_KEY = re.compile(r"[A-Za-z0-9\-_.:]{8,255}")


def new_key(
    time_ns: Callable[[], int] = time.time_ns,
    urandom: Callable[[int], bytes] = os.urandom,
) -> str:
    """Returns a new UUIDv7 in its canonical lower-case 8-4-4-4-12 form.

    Layout (RFC 9562, section 5.7): 48 bits of Unix time in milliseconds, the version 0b0111, 12 random
    bits, the variant 0b10, 62 random bits. ``time_ns`` and ``urandom`` are injectable for tests.
    """
    millis = (time_ns() // 1_000_000) & ((1 << 48) - 1)
    rand = urandom(10)
    if len(rand) != 10:
        raise ValueError("urandom returned %d bytes, not 10" % len(rand))
    r = int.from_bytes(rand, "big")  # 80 bits; 74 are used
    rand_a = r & 0xFFF
    rand_b = (r >> 12) & ((1 << 62) - 1)
    value = (millis << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    h = "%032x" % value
    return "%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


def is_uuid7(text: str) -> bool:
    """True when ``text`` is a canonical lower-case UUIDv7."""
    return _UUID7.fullmatch(text) is not None


def valid_key(text: str) -> bool:
    """True when ``text`` fits idemd's default key policy (8..255 of ``A-Z a-z 0-9 - _ . :``)."""
    return _KEY.fullmatch(text) is not None
