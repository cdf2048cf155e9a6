"""Where pack bytes live: local files, HTTP, object stores, the request policy, uploads."""
