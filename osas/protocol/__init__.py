"""Generated gRPC and protobuf code for the externalgrpc protocol (see proto/)."""
