"""Every Redis key and group name rqse derives, in one place.

rqse itself only writes to streams its callers name, plus the derived keys
below. None of them has a TTL: streams are bounded by trimming
(:mod:`rqse.trim`), not by expiry.
"""

from __future__ import annotations

__all__ = [
    "DEAD_LETTER_SUFFIX",
    "RECEIPT_GROUP",
    "dead_letter_key",
]

# Consumer group of the receipt log (rqse 0.5 used the same name, so an old
# receipt worker and a new one share the group's position).
RECEIPT_GROUP = "__receipt__"

# Entries that could not be processed move from stream ``S`` to ``S:dead``.
DEAD_LETTER_SUFFIX = ":dead"


def dead_letter_key(stream: str) -> str:
    """The dead-letter stream of ``stream`` (``workflow:run`` -> ``workflow:run:dead``)."""
    return stream + DEAD_LETTER_SUFFIX
