"""Sizes to plan a graph with symbolic shapes at (torch.compile's automatic dynamic shapes).

Under ``torch.compile`` a frame that is called at a second size is recompiled with symbolic
dimensions (``s0``, ``s27``): one graph for every size. The IR is numeric, so such a graph is
planned at concrete sizes: each symbol's *hint* (the size of the call that compiled it) unless a
larger size is given (`SymbolSizes.at_least`: the compile backend passes the sizes the same frame
was compiled at before, so a recompile is planned for the largest size seen). Nothing here adds a
guard: sizes are read from the symbols' expressions, never compared through the shape env.

A symbol without a hint (an unbacked, data-dependent size such as the length of a ``nonzero``)
cannot be planned: `SymbolSizes.size` raises `UnplannableSize`.
"""

from __future__ import annotations

import torch


class UnplannableSize(ValueError):
    """A size with no hint: data-dependent, so no plan can be made for it."""


class SymbolSizes:
    """Evaluate symbolic sizes at each symbol's hint or at a larger given size."""

    def __init__(self, at_least: dict | None = None):
        self.at_least = dict(at_least or {})
        """sympy symbol -> size to plan for when larger than its hint."""
        self.used: dict = {}
        """sympy symbol -> the size it was evaluated at (what the plan covers)."""

    def size(self, value) -> int:
        """``value`` (an int or a SymInt) at the planned sizes."""
        if isinstance(value, int):
            return value
        if not isinstance(value, torch.SymInt):
            return int(value)
        expr = value.node.expr
        values = {}
        for symbol in expr.free_symbols:
            hint = self._hint(symbol, value)
            values[symbol] = max(hint, int(self.at_least.get(symbol, hint)))
            self.used[symbol] = values[symbol]
        return int(expr.xreplace(values))

    def _hint(self, symbol, value: torch.SymInt) -> int:
        shape_env = value.node.shape_env
        if shape_env is None:
            raise UnplannableSize(f"size {symbol} has no shape environment")
        known = shape_env.backed_var_to_val if hasattr(shape_env, "backed_var_to_val") else shape_env.var_to_val
        hint = known.get(symbol)
        if hint is None:  # unbacked: no call ever gave it a value
            raise UnplannableSize(f"size {symbol} is data-dependent (no hint)")
        return int(hint)

    def shape(self, t: torch.Tensor) -> tuple[int, ...]:
        return tuple(self.size(d) for d in t.shape)

    def storage_bytes(self, t: torch.Tensor) -> int:
        return self.size(t.untyped_storage().nbytes())

    def numel(self, t: torch.Tensor) -> int:
        return self.size(t.numel())

    def concrete(self, value):
        """A tensor with symbolic sizes as a meta tensor at the planned sizes (for FLOP formulas);
        anything else as it is."""
        if isinstance(value, torch.Tensor) and not all(isinstance(d, int) for d in value.shape):
            strides = tuple(self.size(s) for s in value.stride())
            return torch.empty_strided(self.shape(value), strides, dtype=value.dtype, device="meta")
        if isinstance(value, torch.SymInt):
            return self.size(value)
        return value
