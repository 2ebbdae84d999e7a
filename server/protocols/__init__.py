"""The APIs forkserve speaks, each in both its wire forms (JSON and protobuf messages); transport-free: no Flask, no grpc."""
