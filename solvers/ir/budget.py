"""Parse and format memory budgets given as byte counts or size strings.

Budgets arrive from the CLI and the API as text ("16GB", "512 MiB") or integers. Following the
ecosystem's convention (Hugging Face Accelerate's ``max_memory``), KB, MB, GB, TB and PB are
powers of 10 and KiB, MiB, GiB, TiB and PiB powers of 2; a bare integer is bytes. Reports print
sizes with :func:`format_bytes` in binary units. A `Budget` is what a user means by a budget:
bytes, or a percentage of plain autograd's (store-all's) peak. It is parsed once where the user's
value enters (the API, the CLI) and resolved to bytes once, by the planner that knows the peak.
No torch import: the optimizer core must stay framework-neutral.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal, InvalidOperation

__all__ = ["Budget", "BudgetError", "format_bytes", "parse_bytes", "resolve_budget"]


class BudgetError(ValueError):
    """A budget that cannot be used; the message says how to write a valid one."""


_UNIT_FACTORS: dict[str, int] = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}

# A number (digits with an optional fraction and exponent), optional spaces, optional unit.
_SIZE_RE = re.compile(
    r"^\s*(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<unit>[A-Za-z]*)\s*$"
)

_HINT = "use a number of bytes or a size like 16GB, 512MiB"


def parse_bytes(text: str | int) -> int:
    """Return the positive number of bytes that ``text`` denotes.

    Units are case-insensitive; decimals are allowed ("1.5GB") and fractions of a byte are
    dropped. Raises :class:`BudgetError` for anything malformed, zero or negative.
    """
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise BudgetError(f"invalid budget {text!r} of type {type(text).__name__}: {_HINT}")
    if isinstance(text, int):
        if text <= 0:
            raise BudgetError(f"invalid budget {text}: it must be positive; {_HINT}")
        return text

    if text.strip().endswith("%"):
        raise BudgetError(
            f"invalid budget {text!r}: percentages are not accepted here; "
            "give an absolute size like 16GB or 512MiB"
        )
    match = _SIZE_RE.match(text)
    if match is None:
        raise BudgetError(f"invalid budget {text!r}: {_HINT}")
    unit = match.group("unit").lower() or "b"
    factor = _UNIT_FACTORS.get(unit)
    if factor is None:
        raise BudgetError(
            f"invalid budget {text!r}: unknown unit {match.group('unit')!r}; "
            "use B, KB, MB, GB, TB, PB (powers of 10) or KiB, MiB, GiB, TiB, PiB (powers of 2)"
        )
    try:
        number = Decimal(match.group("number"))
    except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
        raise BudgetError(f"invalid budget {text!r}: {_HINT}") from None
    n_bytes = int((number * factor).to_integral_value(rounding=ROUND_FLOOR))
    if n_bytes <= 0:
        raise BudgetError(f"invalid budget {text!r}: it must be at least one byte; {_HINT}")
    return n_bytes


_BINARY_UNITS: tuple[str, ...] = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int) -> str:
    """Format a byte count for people: ``"512 B"``, ``"1.50 GiB"`` (two decimals, binary units).

    Negative counts keep their sign so that differences between budgets print naturally.
    """
    sign = "-" if n < 0 else ""
    magnitude = abs(n)
    if magnitude < 1024:
        return f"{sign}{magnitude} B"
    value = float(magnitude)
    unit = _BINARY_UNITS[0]
    for unit in _BINARY_UNITS:
        value /= 1024
        # Move up a unit when rounding to two decimals would print 1024.00.
        if round(value, 2) < 1024 or unit == _BINARY_UNITS[-1]:
            break
    return f"{sign}{value:.2f} {unit}"


@dataclass(frozen=True)
class Budget:
    """A memory budget as the user meant it: ``bytes`` (from ``16GB``, ``512MiB`` or an integer) or
    ``percent`` of the step's store-all peak (from ``"60%"``); exactly one is set. ``text`` is
    what the user wrote, for messages. Build it with `Budget.of`, which checks it."""

    size_bytes: int | None = None
    percent: Decimal | None = None
    text: str = ""

    def __post_init__(self) -> None:
        if (self.size_bytes is None) == (self.percent is None):
            raise BudgetError("a Budget is bytes or a percentage, exactly one: use Budget.of(value)")

    @classmethod
    def of(cls, value: Budget | str | int) -> Budget:
        """Parse ``value`` (a `Budget`, bytes, a size string or a percentage); raises
        `BudgetError` saying how to write a valid one."""
        if isinstance(value, Budget):
            return value
        if isinstance(value, str) and value.strip().endswith("%"):
            number = value.strip()[:-1].strip()
            try:
                percent = Decimal(number)
            except InvalidOperation:
                raise BudgetError(f"invalid budget {value!r}: use a percentage like 60%") from None
            if not percent.is_finite() or percent <= 0:
                raise BudgetError(f"invalid budget {value!r}: a percentage must be positive")
            return cls(percent=percent, text=value.strip())
        return cls(size_bytes=parse_bytes(value), text=str(value).strip())

    @property
    def is_percentage(self) -> bool:
        return self.percent is not None

    def resolve(self, store_all_peak_bytes: int) -> int:
        """Bytes: the size itself, or the percentage of ``store_all_peak_bytes`` (at least 1)."""
        if self.percent is None:
            return self.size_bytes
        return max(1, int(store_all_peak_bytes * self.percent / 100))

    def __str__(self) -> str:
        return self.text or (f"{self.percent}%" if self.percent is not None else str(self.size_bytes))


def resolve_budget(budget: Budget | str | int, store_all_peak_bytes: int) -> int:
    """Bytes for ``budget`` (see `Budget`): a size, or a percentage of the step's store-all
    (plain autograd) peak, e.g. ``"60%"`` — what sweeps and what-ifs speak in."""
    return Budget.of(budget).resolve(store_all_peak_bytes)
