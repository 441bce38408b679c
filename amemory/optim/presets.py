"""Peer-faithful Muon settings, used as ``muon(learning_rate, preset=NAME, **overrides)``.

Each preset is a dict of :func:`amemory.optim.scale_by_muon` options plus an optional
``weight_decay``. The PyTorch peers store ``[out, in]`` and scale by ``sqrt(max(1,
rows/cols))``: our ``shape_scale="jordan"`` on ``[fan_in, fan_out]``. ``ns_dtype="auto"``
is bfloat16 on GPU/TPU, as the PyTorch references, and float32 on CPU.

Sources: jordan, github.com/KellerJordan/Muon; torch, torch.optim.Muon defaults
(adjust_lr "original", the norm clamped: ``max(||U||, eps)``); moonlight, arXiv 2502.16982;
optax, optax.contrib.muon 0.2.8 (NAdam-form Nesterov, fp32); wang2025, arXiv 2509.26030,
transformer experiments; deepseek_v4, the DeepSeek-V4 report (8 Jordan NS steps, 2
convergent ones, update RMS 0.18; momentum and wd as moonlight, which it does not restate).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS", "preset_options"]

_JORDAN: dict[str, Any] = {
    "orthogonalizer": "newton_schulz",
    "ns_coeffs": "jordan",
    "ns_steps": 5,
    "momentum": 0.95,
    "momentum_form": "ema",
    "nesterov": True,
    "bias_correction": False,
    "ns_eps": 1e-7,
    "ns_eps_mode": "add",
    "ns_dtype": "auto",
    "shape_scale": "jordan",
    "weight_decay": 0.0,
}

#: name -> options (every preset sets the same fields, so a preset defines them all).
PRESETS: dict[str, dict[str, Any]] = {
    "jordan": _JORDAN,
    "torch": {**_JORDAN, "weight_decay": 0.1, "ns_eps_mode": "clamp"},
    "moonlight": {
        **_JORDAN,
        "momentum_form": "sum",
        "shape_scale": "rms_match",
        "rms_scale": 0.2,
        "weight_decay": 0.1,
    },  # fmt: skip
    "optax": {**_JORDAN, "bias_correction": True, "ns_eps": 1e-8, "ns_dtype": None},
    "wang2025": {**_JORDAN, "momentum_form": "sum", "nesterov": False, "shape_scale": "none"},
}

PRESETS["deepseek_v4"] = {
    **PRESETS["moonlight"], "ns_coeffs": "deepseek_v4", "ns_steps": 10, "rms_scale": 0.18
}  # fmt: skip


def preset_options(name: str) -> dict[str, Any]:
    """A copy of preset ``name``'s options.

    Raises:
      ValueError: unknown name (lists the allowed ones).
    """
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not known; allowed: {sorted(PRESETS)}")
    return dict(PRESETS[name])
