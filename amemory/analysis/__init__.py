"""Analysis of trained weights and training curves; imports no amemory models, data or train.

  spectrum   isotropy metrics of matrices: entropy, effective rank, top-k energy, Q75/25, ...
  balance    per-class error, gap Delta, one-step rho^eps, head/tail buckets
  scaling    power-law fits with confidence intervals
  stats      seed intervals (t, paired, variance ratio) and three-way verdicts
  plots      matplotlib figures used by reports

Submodules are imported explicitly (``from amemory.analysis import spectrum``).
"""
