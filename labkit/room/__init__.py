"""The room: a workshop's shared secure cluster, its live board and the preflight doctor."""
