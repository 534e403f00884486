"""The gRPC face of the engine: the EngineService server and its authentication."""
