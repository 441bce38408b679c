"""``torch.randn`` on CPU (float32, sizes a multiple of 16) in numpy, for the ported tests.

torch seeds a Mersenne Twister (MT19937, ``init_genrand(seed)``), draws one 32-bit word per
float and keeps its low 24 bits (``uniform_real_distribution<float>``: ``(w & 0xFFFFFF) /
2^24``), then turns each block of 16 uniforms into normals by Box-Muller: ``u1 = 1 -
x[j]``, ``u2 = x[j + 8]``, ``x[j] = r cos(2 pi u2)``, ``x[j + 8] = r sin(2 pi u2)`` with
``r = sqrt(-2 log u1)`` (``aten/src/ATen/native/cpu/DistributionTemplates.h``,
``normal_fill_16``). Checked against the values ``torch.manual_seed(42); torch.randn(4,
4)`` prints (first row 1.9269, 1.4873, 0.9007, -2.1055).
"""

import numpy as np


class TorchRandn:
    """``torch.manual_seed(seed)`` then successive ``torch.randn(*shape)`` calls."""

    def __init__(self, seed: int):
        self.bits = np.random.MT19937(0)
        self.bits._legacy_seeding(seed)  # numpy's RandomState(seed) seeding: init_genrand

    def __call__(self, *shape: int) -> np.ndarray:
        n = int(np.prod(shape))
        if n < 16 or n % 16:
            raise ValueError(f"only sizes that are multiples of 16 are ported, got {shape}")
        words = self.bits.random_raw(n) & 0xFFFFFF
        u = (words.astype(np.float32) * np.float32(2.0**-24)).reshape(-1, 2, 8)
        radius = np.sqrt(np.float32(-2.0) * np.log(np.float32(1.0) - u[:, 0]))
        theta = np.float32(2.0 * np.pi) * u[:, 1]
        pairs = np.stack([radius * np.cos(theta), radius * np.sin(theta)], axis=1)
        return pairs.astype(np.float32).reshape(shape)
