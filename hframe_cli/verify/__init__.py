"""Checking packs: the walk over every record, the index columns it compares, the report."""
