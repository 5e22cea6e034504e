"""Tests of the message log: the landing zone, its groups and the hash chain."""
