"""Typed jobs: payload codecs (JSON for dataclasses and plain types, pydantic, msgspec) and
`Task`, one job type's definition shared by producers and handlers."""
