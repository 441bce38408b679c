"""Numerical checks of the statements of Wang et al. 2025 and Li et al. 2026.

``amemory check`` (or ``python -m theory_checks``) runs every check and prints, per
statement of ``papers.md``, what the theory predicts, what the simulation measures, the
tolerance and the verdict; see :mod:`theory_checks.cli` for the flags.

Modules:
  common     CheckResult, the registry (``@register(name)``), the runner, tables, README
             update, and the simulation helpers (amemory's GD/SignGD/Muon as Optax
             transforms, jit + scan trajectories).
  wang2025   paper A (arXiv 2509.26030): Prop. F.3, Theorem 5.3 (GD, Muon, SignGD),
             Theorem 5.4, Fig. 4b/c.
  li2026     paper B (arXiv 2602.05725): noiseless GD/Muon rates, noisy Muon phases, GD
             stability, GD and Muon scaling, implicit preconditioner, TRA-SignGD.

Adding a check: write ``fn(ctx: Context) -> CheckResult`` in the paper's module, decorate
it with ``@register("<paper>.<statement>")``, justify its tolerance in the docstring, honour
``ctx.quick`` (the quick suite runs in the test suite, < 60 s in all) and mark the result
``kind="derived"`` when it tests a consequence rather than the paper's own statement.
Checks run in float64: the runner enables ``jax_enable_x64`` for its process.
"""
