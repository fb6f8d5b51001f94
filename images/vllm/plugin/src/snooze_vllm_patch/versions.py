"""Which vLLM releases carry the hybrid-model wake bug, decided from the version string alone."""

from __future__ import annotations

import enum
import re

FIRST_AFFECTED = (0, 12, 0)
"""The first release whose `init_fp8_kv_scales` calls `.zero_()` on every KV cache entry."""

FIRST_FIXED = (0, 27, 0)
"""The first release with the upstream fix (vLLM PR #41602)."""

# Leading release numbers only: local tags (+cu129) and suffixes (rc1, .dev12) do not move
# a build out of its release line.
_RELEASE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


class Verdict(enum.Enum):
    """What a vLLM version means for the bug."""

    BEFORE = "unaffected"
    """Older than 0.12.0: the method does not exist yet."""

    AFFECTED = "affected"
    """0.12.0 to 0.26.x: the method crashes on list entries and needs the patch."""

    FIXED = "fixed"
    """0.27.0 or later: fixed upstream (and from 0.29.0 the method is gone)."""

    UNKNOWN = "unknown"
    """No release number could be read (e.g. a source checkout reporting "dev")."""


def release_of(version: str) -> tuple[int, int, int] | None:
    """Return the (major, minor, patch) release of a version string, or None; pure."""
    match = _RELEASE.match(version)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def classify(version: str) -> Verdict:
    """Decide whether a vLLM version carries the bug; pure.

    A development build between two releases (0.26.1.dev5) counts as affected: the patch is
    harmless on a body that already handles lists, while leaving a buggy one alone is not.
    """
    release = release_of(version)
    if release is None:
        return Verdict.UNKNOWN
    if release < FIRST_AFFECTED:
        return Verdict.BEFORE
    if release < FIRST_FIXED:
        return Verdict.AFFECTED
    return Verdict.FIXED
