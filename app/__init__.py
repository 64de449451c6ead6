"""HTTP layer of the attribution service."""
