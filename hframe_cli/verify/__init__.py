"""Checking packs: the walk over every record, the index columns it compares, the report."""

#: Frames ``pack`` reads back from disk and compares before it publishes (``check.self_check``).
DEFAULT_SELF_CHECK = 20
