"""Spark jobs over the lake: classification of batches into items (`items.py`), the fold
(`fold/`), the interpreted model (`model.py`), the hash-chain check (`chain.py`), dead-letter
replay (`replay.py`), the lake's checks (`checks.py`, `dead_letter_summary.py`) and bounded
Arrow batches (`arrow.py`)."""
