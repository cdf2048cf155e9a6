"""The bytes on disk: the pack layout, per-frame codecs, the Parquet index and its labels."""
