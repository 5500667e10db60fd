"""Generated gRPC and protobuf code of the tiermesh.v1 contract (protos/tiermesh/v1/*.proto).

The *_pb2 modules are written by `make protos` (development) or by the wheel build; never by
hand. Other languages generate their own stubs from the same .proto files.
"""
