"""HTTP API of the chat turn: the FastAPI app, its schemas, auth, limits, errors and metrics."""
