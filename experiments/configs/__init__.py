"""Run configurations: one ``get_config(scale)`` per model family (``lm.py``, ``memory.py``)."""
