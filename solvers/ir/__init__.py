"""Layer 0, the torch-free IR: the graph, schedules, the simulator (the one oracle for memory and
cost), budgets, the allocator model, the lossless reduction, plans and their text.

Imports nothing from the other layers (see docs/design.md "Layout"; `tests/test_layers.py` checks it).
"""
