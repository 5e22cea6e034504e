"""Tests of the process-level utilities of sis_platform/runtime/."""
