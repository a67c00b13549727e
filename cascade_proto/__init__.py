"""gRPC stubs generated from proto/cascade/ by `scripts/gen-proto.sh` (run by `make install`).

Only this file is committed; `cascade_proto.v1.reward_pb2` and the other stubs are generated.
"""
