"""Output storage: atomic writes, shard manifests, WebDataset tars."""
