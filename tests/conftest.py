"""Shared pytest configuration.

Fixtures live in ``tests/fixtures/<topic>.py`` (one module per real server or artefact
they provide) and are registered here as plugins, so every test can use them.
"""

pytest_plugins = [
    "tests.fixtures.redis",
    "tests.fixtures.broker",
    "tests.fixtures.tiny_model",
]
