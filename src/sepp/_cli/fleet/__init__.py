"""`sepp-trio worker --processes N`: a supervisor running N worker processes of one target.

- `supervisor`: the group's process, on trio: starts the children, passes signals on, replaces
  a child that exits unexpectedly as `policy` decides, and exits 0 only when every child did;
- `policy`: when to restart a child and when to give up (`RestartPolicy`, no I/O);
- `child`: a child's side (its entry point, and `SupervisorLink`, its end of the pipe);
- `messages`: what a child tells the supervisor, typed, with one encode/decode;
- `group_http`: the group's `/healthz`, `/readyz` and `/metrics`, asking every child.
"""
