"""Other clients against our server: tritonclient, the KServe SDK, MLServer as a remote model."""
