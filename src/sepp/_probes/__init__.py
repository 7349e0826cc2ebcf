"""What a process tells the outside when asked, for every front end alike: a small HTTP/1
server for probes and metrics scrapes, on a thread of its own (`server`, with the requests and
answers of `http1`), and the Prometheus text exposition format (`prometheus`). The Worker's
monitor, the outbox relay and the `--processes` supervisor serve through them; they import
nothing of sepp's above `_util`."""
