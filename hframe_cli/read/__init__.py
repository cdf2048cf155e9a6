"""Packs and datasets in, frames out: snapshots, the reader, datasets, get, dump-header, benches."""
