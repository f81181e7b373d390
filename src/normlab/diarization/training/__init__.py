"""Training the EEND model: PIT loss, the training loop, and the recipe that makes the shipped model."""
