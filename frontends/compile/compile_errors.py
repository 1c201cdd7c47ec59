"""Let remat-opt's own errors reach a ``torch.compile`` user as themselves.

Dynamo wraps whatever a backend raises in ``BackendCompilerFailed`` and prints the whole dynamo
and AOTAutograd stack above it, so a too-small budget would read as a compiler crash. Dynamo
passes one family of exceptions through untouched, ``ShortenTraceback``, and trims their
traceback to the frame they name. `planning_errors` tags every exception raised while the
backend plans a graph; `own_error_to_raise` (in the backend's entry point) finds a tagged
exception in what the compile raised and re-raises it as a subclass of its own type and of
``ShortenTraceback``: ``except InfeasibleBudgetError`` still catches it, its message and
attributes are the original's, and the traceback ends at the backend's entry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from frontends.torch_compat import dynamo_config, dynamo_shorten_traceback

_TAG = "_raised_by_remat_opt"
_surfaced_types: dict[type, type] = {}


@contextlib.contextmanager
def planning_errors() -> Iterator[None]:
    """Mark exceptions raised in the block as remat-opt's (bad budget, capture, rewrite)."""
    try:
        yield
    except Exception as err:
        setattr(err, _TAG, True)
        raise


def error_in_chain(err: BaseException | None, matches: Callable[[BaseException], bool]) -> BaseException | None:
    """The first exception that ``matches``, from ``err`` through what wrapped it (dynamo's
    ``inner_exception``, then ``__cause__`` / ``__context__``); None when none does."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if matches(err):
            return err
        err = getattr(err, "inner_exception", None) or err.__cause__ or err.__context__
    return None


def _own_error(err: BaseException | None) -> BaseException | None:
    return error_in_chain(err, lambda e: getattr(e, _TAG, False))


def _original_message(self: BaseException) -> str:
    """Dynamo appends hints ("Set TORCHDYNAMO_VERBOSE=1 ...") to ``args``; the message stays ours."""
    return self.__dict__.get("_remat_opt_message", "")


def _surfaced_type(cls: type) -> type:
    ShortenTraceback = dynamo_shorten_traceback()  # dynamo, imported only when torch.compile runs
    if cls not in _surfaced_types:
        _surfaced_types[cls] = type(cls.__name__, (cls, ShortenTraceback), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__str__": _original_message, "__doc__": cls.__doc__})
    return _surfaced_types[cls]


def surfaced(err: BaseException, frame) -> BaseException:
    """``err`` as an exception dynamo lets through (same type family, message and attributes)."""
    try:
        cls = _surfaced_type(type(err))
    except TypeError:  # an exception type that cannot be combined (layout conflict): keep it
        return err
    clone = cls.__new__(cls, *err.args)
    clone.args = err.args
    clone.__dict__.update(err.__dict__)
    clone.first_useful_frame = frame
    clone._remat_opt_message = str(err)
    return clone


def own_error_to_raise(err: BaseException, frame) -> BaseException | None:
    """What the backend entry point (``frame``) should raise instead of ``err``: remat-opt's
    tagged error inside it, surfaced; None when ``err`` is not ours (raise it unchanged)."""
    config = dynamo_config()  # dynamo, imported only when torch.compile runs

    own = _own_error(err)
    if own is None:
        return None
    clone = surfaced(own, frame)
    if config.verbose:  # TORCHDYNAMO_VERBOSE=1: keep the whole stack, for a bug report
        clone = clone.with_traceback(own.__traceback__)
    return clone
