"""The only place with SQL: monkey.db's schema, migrations and typed queries."""

from monkey.store.db import Store

__all__ = ["Store"]
