"""Integrations of sepp-trio with other services, each behind an extra of its own and never
imported by `import sepp`: `sepp.contrib.sentry` (the `sentry` extra)."""
