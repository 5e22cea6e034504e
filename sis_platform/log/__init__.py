"""The message log, the platform's source of truth (docs/design.md invariants 1 and 5): the
landing zone that holds every landed message (`landing/`), the hash chain over them and the
anchors that pin it (`chain.py`), the log key and witness that keep the anchors out of the data
folder's reach (`seal.py`), and a message's place in the log (`position.py`). No Dagster or
Spark import; `position.py` and `chain.py` import nothing heavy, so a reader of the serving
store does not load the landing zone's Parquet code."""
