"""Schedulers: each looks at the cluster and proposes operators toward one goal."""
