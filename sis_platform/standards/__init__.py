"""General engines for published standards, free of the feed's rules: RFC 5261 XML patches
(`xmlpatch.py`) over the XPath subset they select with (`xpath.py`), and JMS message selectors
(`selector.py`, whose LIKE patterns `like.py` matches in linear time). They import nothing else
of the platform; `domain/` applies them to Sportsdata messages."""
