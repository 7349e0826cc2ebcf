"""The default engine: our purpose-built sans-IO HTTP/2 client codec for unary gRPC calls
(`_connection.CodecGrpcConnection`)."""
