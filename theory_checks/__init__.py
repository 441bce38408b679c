"""Numerical checks of the statements of Wang et al. 2025, Li et al. 2026 and Kim et al. 2026.

``amemory check`` (or ``python -m theory_checks``) runs every check and prints, per
statement (listed with its source and reading in ``docs/science.md``), what the theory
predicts, what the simulation measures, the tolerance and the verdict; see
:mod:`theory_checks.cli` for the flags.

Modules:
  common            CheckResult, the registry (``@register(name)``), the runner, tables,
                    README update, and jit + scan trajectories of the papers' optimizers
                    (which live once in :mod:`amemory.analysis.one_step`).
  wang2025          paper A (arXiv 2509.26030): Prop. F.3, Theorem 5.3 (GD, Muon, SignGD
                    with E = Ẽ = I), Theorem 5.4 (constant and scheduled steps), Fig. 4b/c.
  wang2025_signgd   paper A's coupled SignGD counter-example: σ ratio, the exact per-block
                    reduction, the bound at the first crossing, exponents per L mod 3, the
                    regime change.
  li2026            paper B (arXiv 2602.05725): noiseless GD/Muon rates, step counts, noisy
                    Muon phases, GD stability; shared helpers.
  li2026_scaling    paper B's scaling laws: GD and Muon bounds, their log K factors, the
                    growth of Muon's advantage with T.
  li2026_structure  paper B's structure: implicit preconditioner, group block symmetry,
                    TRA-SignGD, SignGD in the original coordinates.
  kim2026           Kim et al. 2026 (arXiv 2603.26554): one-step capacity of Muon vs SGD
                    with Gaussian embeddings.
  certified         closed forms proved over ranges by ball arithmetic (python-flint).

Adding a check: write ``fn(ctx: Context) -> CheckResult`` in the paper's module (every
module of this package is imported by :func:`theory_checks.cli._load`), decorate it with
``@register("<paper>.<statement>")``, justify its tolerance in the docstring, state its
reading of the paper where the text allows two, honour ``ctx.quick`` (the quick suite runs
in the test suite, < 60 s in all), mark the result ``kind="derived"`` when it tests a
consequence rather than the paper's own statement, and add the statement to
``docs/science.md``. Checks run in float64: the runner enables ``jax_enable_x64`` for its
process.
"""
