"""Spark jobs over the lake: classification of batches into items, the fold (fold/), the
interpreted model, the hash-chain check, replay, and the per-item guard."""
