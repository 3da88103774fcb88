"""Storage: the lab's one database adapter (SQLite, the zero-setup default, or PostgreSQL
through a DSN), its one table reader, and the lab's own PostgreSQL server."""
