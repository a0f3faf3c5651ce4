"""Loaders of real federated data sets (no downloads: files are read from a local data root)."""
