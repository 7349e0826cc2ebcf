"""The transactional outbox: jobs written into the application's own database in its own
transaction (`Outbox.add`), and the relay that forwards them to the server (`OutboxRelay`).

- `dialects`: the SQL for each database (sqlite3, PostgreSQL), and telling them apart;
- `rows`: a job as a row and back;
- `outbox`: `Outbox` (add, the table);
- `store`: the relay's database work (blocking: claim, settle, count, wait for rows);
- `policy`: what the relay does with the server's answers, and when it tries again (no I/O);
- `relay`: `OutboxRelay`, the loop on trio or asyncio (DB calls in a thread) or in a thread;
- `metrics`: its counters as Prometheus text.
"""
