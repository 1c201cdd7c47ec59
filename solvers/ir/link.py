"""The device-host link an offloaded value crosses: bandwidth each way and a per-copy latency.

Offloading (issue 39) trades link time for device memory: a saved value is copied to pinned host
memory after forward makes it and copied back before backward reads it. What that costs is the
copy time compute does not hide, so the simulator needs the link's numbers. The presets are the
datasheet rates per direction (what one copy stream reaches with pinned buffers is close to
them); measure the link on the device for more. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """One device-host link: one copy stream per direction, each at its own bandwidth."""

    name: str
    device_to_host_bytes_per_s: float
    """Offload bandwidth (bytes/s)."""
    host_to_device_bytes_per_s: float
    """Reload bandwidth (bytes/s)."""
    latency_s: float = 10e-6
    """Fixed seconds per copy (issue and completion), paid by every offload and reload."""

    def __post_init__(self) -> None:
        for field_name in ("device_to_host_bytes_per_s", "host_to_device_bytes_per_s"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Link.{field_name} must be a positive number of bytes/s, got {value!r}")
        if isinstance(self.latency_s, bool) or not isinstance(self.latency_s, (int, float)) or self.latency_s < 0:
            raise ValueError(f"Link.latency_s must be a non-negative number of seconds, got {self.latency_s!r}")

    def offload_seconds(self, nbytes: int) -> float:
        """How long the device-to-host copy of ``nbytes`` occupies its stream."""
        return self.latency_s + nbytes / self.device_to_host_bytes_per_s

    def reload_seconds(self, nbytes: int) -> float:
        """How long the host-to-device copy of ``nbytes`` occupies its stream."""
        return self.latency_s + nbytes / self.host_to_device_bytes_per_s

    def describe(self) -> str:
        return (f"{self.name} ({self.device_to_host_bytes_per_s / 1e9:.3g} GB/s to host, "
                f"{self.host_to_device_bytes_per_s / 1e9:.3g} GB/s to device, "
                f"{self.latency_s * 1e6:.3g} us a copy)")


LINKS: dict[str, Link] = {
    "pcie4": Link("pcie4", 25e9, 25e9),
    "pcie5": Link("pcie5", 55e9, 55e9),
    "nvlink-c2c": Link("nvlink-c2c", 450e9, 450e9, latency_s=5e-6),
}
"""Presets: PCIe Gen4 x16 (~25 GB/s each way, A100/L4 class), PCIe Gen5 x16 (~55 GB/s each
way, H100/H200 in PCIe hosts; issue 39's figure for an H200) and NVLink-C2C (~450 GB/s each
way, GH200's Grace-Hopper link)."""

DEVICE_LINKS = {"h100": "pcie5", "h200": "pcie5", "gh200": "nvlink-c2c"}
"""The link a `--device` name is usually attached by; any other device gets PCIe Gen4."""


def get_link(link: str | Link) -> Link:
    """``link`` itself, or the preset it names; ValueError listing the presets."""
    if isinstance(link, Link):
        return link
    if isinstance(link, str) and link.strip().lower() in LINKS:
        return LINKS[link.strip().lower()]
    raise ValueError(f"unknown link {link!r}: choose one of {', '.join(LINKS)} or pass a Link(...)")


def default_link(device: str | None) -> Link:
    """The preset for a device name (``h200`` -> pcie5); PCIe Gen4 for any other or None."""
    key = (device or "").strip().lower()
    return LINKS[DEVICE_LINKS.get(key, "pcie4")]


def fitted_link(name: str, sizes: Sequence[int], to_host_s: Sequence[float],
                to_device_s: Sequence[float]) -> Link:
    """A `Link` from measured copy times (seconds per copy of each of ``sizes`` bytes, per
    direction): per direction the least-squares line seconds = latency + bytes / bandwidth. A
    negative intercept (noise on a link that is all bandwidth) becomes a latency of 0 with the
    line through the origin; the two latencies are averaged (`Link` has one)."""
    if len(sizes) < 2 or len(set(sizes)) < 2 or not len(sizes) == len(to_host_s) == len(to_device_s):
        raise ValueError("fitted_link needs copy times for at least two different sizes, one per size and direction")

    def line(times: Sequence[float]) -> tuple[float, float]:
        n = len(sizes)
        mean_x, mean_y = sum(sizes) / n, sum(times) / n
        slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, times))
                 / sum((x - mean_x) ** 2 for x in sizes))
        intercept = mean_y - slope * mean_x
        if intercept < 0 or slope <= 0:  # through the origin
            slope, intercept = sum(x * y for x, y in zip(sizes, times)) / sum(x * x for x in sizes), 0.0
        if slope <= 0:
            raise ValueError(f"copy times {list(times)} do not grow with size: no bandwidth to fit")
        return intercept, 1.0 / slope

    latency_out, to_host = line(to_host_s)
    latency_in, to_device = line(to_device_s)
    return Link(name, to_host, to_device, latency_s=(latency_out + latency_in) / 2)


def offload_link_of(offload: bool | str, link: Link | str | None) -> Link | None:
    """The link offloads are priced on, or None when offload is off (``False``). ``offload`` is
    ``"auto"`` or False; ``link`` a `Link` or preset name (default ``pcie5``)."""
    if offload is False or offload is None:
        if link is not None:
            raise ValueError("link= prices offloaded values: pass offload='auto' with it")
        return None
    if offload != "auto":
        raise ValueError(f"offload is 'auto' (keep, recompute or offload each saved value) or False, got {offload!r}")
    return get_link(link if link is not None else "pcie5")
