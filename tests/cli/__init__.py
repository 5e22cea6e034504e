"""Tests of the console scripts of sis_platform/cli/ that no other folder covers."""
