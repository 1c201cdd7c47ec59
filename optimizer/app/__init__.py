"""Layer 4, the app users touch: `optimize` / `plan_only` (api), the ``remat-opt`` command (cli),
what-if reports and plots, planning without hardware, and the verify run. Sits on top of
everything: may import the frontends, planning, solvers and the IR.
"""
