"""Analysis of trained weights and training curves, and the science kernel of the one-layer
memory; imports no amemory models, data or train (``one_step`` uses amemory.optim, which is
pure Optax).

  spectrum         isotropy metrics of matrices: entropy, effective rank, top-k energy, Q75/25
  balance          top-1 error per class, gap Delta, the one-step rho^eps search, head/tail split
  one_step         GD/SignGD/Muon, rho^eps, GD closed form: shared by experiments/, theory_checks/
  signgd_blocks    exact per-block reduction of one coupled SignGD step (paper A), any K
  group_symmetric  paper B's GD/TRA-SignGD/Muon on the group-symmetric subspace, any K
  scaling          straight-line and power-law fits with confidence intervals
  stats            seed intervals (t, paired, variance ratio) and three-way verdicts
  plots            matplotlib figures used by reports

Submodules are imported explicitly (``from amemory.analysis import spectrum``).
"""
