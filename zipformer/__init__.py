"""Zipformer CTC models and their training (Zipformer paper, Yao et al., ICLR 2024).

Kept minimal on purpose: import submodules directly, e.g.
``from zipformer.model import CTCModel`` or ``from zipformer.presets import get_preset``.
"""

import asr  # noqa: F401  (OpenMP settings before torch loads: asr/threads.py)
