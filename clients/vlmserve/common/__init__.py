"""Code the engine, the facade and the client library all use: image checks, files and PDFs, trace
context.

It lives in the base install (`clients/`), which both the engine and the facade depend on.
Server-only shared code (settings, logs, secrets) is `vlmserve.server`, in `service/`.
"""
