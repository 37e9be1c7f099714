"""The gRPC face of osas: translation between the protocol and the engine, nothing more."""
