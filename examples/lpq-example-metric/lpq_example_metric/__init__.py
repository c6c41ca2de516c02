"""lpq-example-metric: a worked example of a metric published as its own package.

See docs/writing-a-metric.md. Importing this package imports nothing.
"""
