"""Run configurations: one ``get_config(scale)`` per model family (``lm.py``, ``memory.py``)."""

from ml_collections import ConfigDict

SCALES = ("quick", "full")


def check_scale(scale: str) -> bool:
    """Whether ``scale`` is ``"quick"``; ``ValueError`` if it is not one of ``SCALES``."""
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r}; allowed values: {SCALES}")
    return scale == "quick"


def new_config(scale: str) -> tuple[ConfigDict, bool]:
    """An experiment config holding only ``scale``, and whether ``scale`` is ``"quick"``
    (:func:`check_scale`)."""
    quick = check_scale(scale)
    c = ConfigDict()
    c.scale = scale
    return c, quick
