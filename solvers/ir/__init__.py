"""The IR, the lowest layer of the torch-free core: the graph, schedules, the simulator (the one
oracle for memory and cost), `Budget`, the allocator model, the lossless reduction, plans and
their text.

Imports nothing else of the project (see docs/design.md "Layout"; `tests/test_layers.py` checks it).
"""
