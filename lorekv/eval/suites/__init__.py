"""Readers, prompts and answer metrics of the standard long-context suites."""
