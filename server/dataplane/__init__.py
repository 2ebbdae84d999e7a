"""The dataplane: a request's validated tensors through the model's executor to its answer, for every API and transport.

server.http (Flask) and server.rpc (grpcio) only adapt: they parse their wire, call the dataplane
and map its errors (server.errors) to their status codes. Nothing here imports Flask or grpc.
"""
