"""Peers side by side: shap, shapiq and captum on the same models and inputs, and the peer
servers (MLServer, a plain OIP server) that the tests start."""
