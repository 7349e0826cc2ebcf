"""The values users handle (payloads, requests, jobs, leases, server info, dead letters), the
SeppError tree, per-job rejections, the checks made before anything is sent, what a handler's
failure means for its job, the one backoff after failures (and `sepp.Backoff`), and the
conversion between these and the wire messages. No I/O."""
