"""The feed's rules in plain Python and lxml, with no Dagster and no Spark: parsing and validating
a message against the Sportsdata schema and the bounds (`messages.py`, `schema.py`,
`limits.py`), splitting it into items (`items.py`), validating what a patch can have changed
(`patchscope.py`), the reference fold of one master and the serial reference pipeline
(`fold.py`, `pipeline.py`), the duplicate rule and its window (`dedup.py`), the interpreted
model (`interpret.py`), priorities (`priority.py`), the reason codes (`reasons.py`) and the
poison policy both paths apply to failures of unknown cause: timeouts, deaths, quarantine
(`poison.py`). The general engines it applies (RFC 5261 patches, XPath, JMS selectors) are in
sis_platform/standards/; the Spark transforms run this same code in their Python workers."""
