"""What every job shares: config loading, storage URIs, Ray start-up, metrics."""
