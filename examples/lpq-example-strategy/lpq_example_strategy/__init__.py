"""lpq-example-strategy: a worked example of a tuning strategy published as its own package.

See docs/writing-a-strategy.md. Importing this package imports nothing.
"""
