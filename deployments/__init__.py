"""recallserve package."""
