"""Repository-root conftest: makes the top-level packages importable without installing."""
