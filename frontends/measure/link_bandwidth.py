"""The device-host link measured on the device itself (issue 39: the presets are datasheet
rates; "measured on the device when one is present").

What is timed is what the runtimes do: `frontends.graph_runtime.offload_ops` copies a value to
host (pinned, on the device-to-host side stream) and back (host-to-device side stream), waited
for the way the compute stream waits, for a few sizes; `solvers.ir.link.fitted_link` fits
latency + bytes / bandwidth per direction. On the CPU the "link" is the host copy those ops make
(a memcpy), which is what an offloaded plan costs there. One measurement per device per process.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

from frontends.graph_runtime.offload_ops import offload_done, offload_to_host, reload_done, reload_to_device
from solvers.ir.link import Link, fitted_link

SIZES = (1 << 20, 8 << 20, 32 << 20)
"""Bytes per timed copy: 1, 8 and 32 MiB (a latency point and two bandwidth points)."""
REPEATS = 3
"""Timed copies per size and direction (after one warm-up), their median kept."""


def measure_link(device: torch.device | str, sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS) -> Link:
    """The link between ``device`` and host memory, measured (cached per device)."""
    return _measured(str(torch.device(device)), tuple(sizes), repeats)


def resolve_link(link: Link | str | None, device: torch.device | str) -> Link | str | None:
    """``link``, with ``"measured"`` replaced by `measure_link` on ``device``."""
    if isinstance(link, str) and link.strip().lower() == "measured":
        return measure_link(device)
    return link


def measured_link_settings(model: torch.nn.Module, settings: dict) -> dict:
    """Planner settings with ``link="measured"`` (under ``offload="auto"``) replaced by the link
    between host memory and the device ``model``'s parameters are on, measured there."""
    if settings.get("offload") != "auto" or "link" not in settings:
        return settings
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return {**settings, "link": resolve_link(settings["link"], device)}


@functools.lru_cache(maxsize=None)
def _measured(device_name: str, sizes: tuple[int, ...], repeats: int) -> Link:
    device = torch.device(device_name)
    to_host, to_device = [], []
    for nbytes in sizes:
        value = torch.ones(nbytes, dtype=torch.uint8, device=device)  # pages touched: no first-use faults timed
        out, back = [], []
        for _ in range(repeats + 1):  # the first: pinned blocks, streams and caches warm up
            _synchronize(device)
            start = time.perf_counter()
            host = offload_done(offload_to_host(value), value)
            _synchronize(device)
            middle = time.perf_counter()
            reload_done(reload_to_device(host, device))
            _synchronize(device)
            out.append(middle - start)
            back.append(time.perf_counter() - middle)
        to_host.append(statistics.median(out[1:]))
        to_device.append(statistics.median(back[1:]))
    return fitted_link(f"measured:{device_name}", sizes, to_host, to_device)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
