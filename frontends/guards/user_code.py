"""Which source is the user's: what remat-opt names in its messages (file:line), and whose
hooks, variables and calls it checks. Not torch, not installed packages, not the standard library,
not remat-opt's own packages."""

from __future__ import annotations

import os
import sysconfig

import torch

_PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # frontends/guards/
_NOT_USER = (sysconfig.get_paths()["stdlib"] + os.sep,
             *(os.path.join(_PROJECT, pkg) + os.sep for pkg in ("frontends", "optimizer", "solvers")))


def is_user_file(filename: str) -> bool:
    """Source the user wrote: not torch, not an installed package, not the standard library,
    not remat-opt's own packages."""
    path = os.path.abspath(filename)
    return not (filename.startswith("<") or "site-packages" in path or "dist-packages" in path
                or f"{os.sep}torch{os.sep}" in path or path.startswith(_NOT_USER))


def short_path(filename: str) -> str:
    path = os.path.abspath(filename)
    here = os.getcwd() + os.sep
    return path[len(here):] if path.startswith(here) else path


def first_user_frame(frame) -> str | None:
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return None if frame is None else f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def stack_location(node: torch.fx.Node) -> str | None:
    """The user's file:line in an fx node's recorded stack trace."""
    for user in (node, *node.users):
        for line in reversed((user.meta.get("stack_trace") or "").splitlines()):
            line = line.strip()
            if line.startswith('File "') and '", line ' in line:
                filename, rest = line[len('File "'):].split('", line ', 1)
                if is_user_file(filename):
                    return f"{short_path(filename)}:{rest.split(',')[0]}"
    return None
