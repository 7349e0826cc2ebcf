"""A sepp server in pure Python, in memory (`sepp.testing.MemoryServer`): the semantic core
(`state`, `rules`, `service`), the HTTP/2 side (`h2_server`), what joins them (`core`), and a
driver per event loop (`trio_driver`, `asyncio_driver`)."""
