"""Qt item models (tables and trees) over the session's data."""
