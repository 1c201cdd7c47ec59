"""The link measured on the device (issue 39): the fit recovers a known line, the measurement
times the runtime's own copies per direction (a fake clock), and on this CPU it runs once per
device. Real timings are not asserted: a shared 2-core VM times a 1 MiB memcpy at 0.1-8 ms."""

from __future__ import annotations

import pytest

from frontends.measure.link_bandwidth import measure_link, resolve_link
from solvers.ir.link import LINKS, fitted_link


def test_the_fit_recovers_latency_and_bandwidth_per_direction():
    sizes = [1 << 20, 8 << 20, 64 << 20]
    link = fitted_link("synthetic", sizes, [20e-6 + n / 25e9 for n in sizes], [20e-6 + n / 50e9 for n in sizes])
    assert link.device_to_host_bytes_per_s == pytest.approx(25e9)
    assert link.host_to_device_bytes_per_s == pytest.approx(50e9)
    assert link.latency_s == pytest.approx(20e-6)


def test_a_negative_intercept_means_no_latency_and_a_line_through_the_origin():
    sizes = [1 << 20, 2 << 20]
    link = fitted_link("noisy", sizes, [0.5e-4, 2e-4], [1e-4, 2e-4])
    assert link.latency_s == 0.0 and link.device_to_host_bytes_per_s > 0


def test_bad_measurements_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="at least two different sizes"):
        fitted_link("one", [1 << 20], [1e-4], [1e-4])
    with pytest.raises(ValueError, match="do not grow with size"):
        fitted_link("flat", [1 << 20, 2 << 20], [-1e-4, -1e-4], [1e-4, 2e-4])


def test_the_runtime_copies_are_timed_per_direction_and_fitted(monkeypatch):
    """A fake clock that each copy advances by a known line: the measured link is that line
    (the warm-up copy, here ten times slower, is dropped)."""
    import frontends.measure.link_bandwidth as measured

    clock = [0.0]
    warm = {"out": True, "back": True}

    def advance(direction: str, nbytes: int, latency: float, bandwidth: float) -> None:
        slow = 10.0 if warm[direction] else 1.0
        warm[direction] = False
        clock[0] += slow * (latency + nbytes / bandwidth)

    def offload_done(host, value):
        advance("out", value.numel(), 30e-6, 4e9)
        return host

    def reload_done(value):
        advance("back", value.numel(), 30e-6, 8e9)
        return value

    monkeypatch.setattr(measured.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(measured, "offload_done", offload_done)
    monkeypatch.setattr(measured, "reload_done", reload_done)
    measured._measured.cache_clear()
    try:
        link = measure_link("cpu", sizes=(1 << 10, 1 << 14, 1 << 16), repeats=3)
    finally:
        measured._measured.cache_clear()
    assert link.device_to_host_bytes_per_s == pytest.approx(4e9)
    assert link.host_to_device_bytes_per_s == pytest.approx(8e9)
    assert link.latency_s == pytest.approx(30e-6)


def test_measured_on_this_cpu_once_per_device():
    link = measure_link("cpu", sizes=(1 << 16, 1 << 20))
    assert link.name == "measured:cpu" and link.device_to_host_bytes_per_s > 0 and link.latency_s >= 0
    assert measure_link("cpu", sizes=(1 << 16, 1 << 20)) is link
    assert resolve_link("pcie5", "cpu") == "pcie5" and resolve_link(LINKS["pcie4"], "cpu") is LINKS["pcie4"]
    assert resolve_link("measured", "cpu").name == "measured:cpu"
