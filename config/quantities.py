"""Kubernetes quantities as numbers, for comparing requests with limits."""

from __future__ import annotations

from decimal import Decimal

_SUFFIXES = {
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
    "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
}


def parse_quantity(quantity: str) -> Decimal:
    """'4Gi' -> 4294967296, '500m' -> 0.5; the input is already validated as a quantity."""
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if quantity.endswith(suffix):
            return Decimal(quantity[: -len(suffix)]) * _SUFFIXES[suffix]
    return Decimal(quantity)
