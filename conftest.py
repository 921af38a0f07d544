"""Repository-root conftest: the top-level packages import from here without installing.

It holds no settings: `python -m bench` runs its own pytest session from this folder too, and
must time the frameworks with their default threads. Test-session settings live in
tests/conftest.py and conformance/tests/conftest.py.
"""
