"""lpq-acme-npu: a worked example of a backend profile published as its own package.

See docs/adding-a-backend.md. Importing this package imports nothing heavy.
"""
