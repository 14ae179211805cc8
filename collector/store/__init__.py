"""The durable span store (one writer thread, group commit, Arrow appends) and the database schema."""
