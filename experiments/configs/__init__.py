"""Run configurations: one ``get_config(scale)`` per model family (``lm.py``, ``memory.py``)."""

SCALES = ("quick", "full")


def check_scale(scale: str) -> bool:
    """Return whether ``scale`` is ``"quick"``.

    Raises:
      ValueError: if ``scale`` is not one of ``SCALES``.
    """
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r}; allowed values: {SCALES}")
    return scale == "quick"
