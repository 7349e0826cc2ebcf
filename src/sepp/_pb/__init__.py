"""Generated protobuf messages for sepp.v1 (make gen)."""
