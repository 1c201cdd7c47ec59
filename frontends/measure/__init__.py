"""Measure: what a step costs, predicted per op and measured on the machine.

Per-op cost models (`costs`: FLOP and roofline, with the device table of `devices`; `profile`:
every op timed on its device), and the measurements every prediction is checked against: live
storage bytes of eager code (`memory_tracker`, `resize_tracker` for storages resized in place),
an extern kernel's workspace (`kernel_workspace`), and one real training step's peak and time
(`frontends.measure.step`).
"""
