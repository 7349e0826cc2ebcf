"""Periodic jobs: `Schedule` (pure occurrence maths every scheduler agrees on) and `Scheduler`
(enqueues each occurrence once, with an idempotency key derived from it)."""
