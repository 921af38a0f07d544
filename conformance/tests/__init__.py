"""Tests of the conformance suite itself (and the conformance run of the three implementations)."""
