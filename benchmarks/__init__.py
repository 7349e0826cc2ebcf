"""Side-by-side benchmarks of sepp-trio against the official clients (``python -m benchmarks``).

See benchmarks/README.md. Nothing here is imported by the library or the test suite.
"""
