"""Tests of the standards engines: RFC 5261 patches, the XPath subset, JMS selectors."""
