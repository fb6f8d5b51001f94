"""Kubernetes resource quantities (`80Gi`, `512Mi`, `1.5G`) parsed to bytes and printed back."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# The forms a memory quantity takes in Kubernetes (resource.Quantity): a decimal number and
# a binary (Ki..Ei) or decimal (k, M..E) suffix, or an exponent. The same pattern goes into
# the CRD so that the API server refuses what the operator could not read.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|[eE][0-9]+)?$"
_SUFFIX = {
    "": 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
GIB = 2**30
MAX_QUANTITY = 2**63 - 1


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity such as `80Gi`."""


def parse_quantity(text: str) -> int:
    """Return the number of bytes that `text` (such as `80Gi` or `1.5G`) stands for."""
    match = re.fullmatch(QUANTITY_PATTERN, text)
    if match is None:
        raise QuantityError(
            f"{text!r} is not a quantity: write a number and a unit, such as '80Gi', '512Mi' "
            "or '40G' (Gi is 2^30 bytes, G is 10^9)"
        )
    number, suffix = match.group(1), match.group(3) or ""
    try:
        value = Decimal(number)
        if suffix[:1] in ("e", "E") and suffix not in _SUFFIX:
            value *= Decimal(10) ** int(suffix[1:])
        else:
            value *= _SUFFIX[suffix]
    except (InvalidOperation, OverflowError) as exc:
        raise QuantityError(f"{text!r} is too large a quantity") from exc
    if value > MAX_QUANTITY:
        # Kubernetes' resource.Quantity holds at most this; a larger one is surely a typo.
        raise QuantityError(
            f"{text!r} is larger than Kubernetes can represent (2^63-1 bytes, about 8Ei): "
            "write a smaller one"
        )
    return int(value)


def format_gib(size: float) -> str:
    """Bytes as GiB for people: `30GiB`, `1.5GiB`, `0.25GiB`."""
    gib = size / GIB
    return f"{gib:.0f}GiB" if gib == round(gib) else f"{gib:.3g}GiB"
