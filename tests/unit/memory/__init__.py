"""Unit tests of memory_shards."""
