"""Making packs: the writer, the run, parallel workers, checkpoints, the lock, update, shards, upload."""
