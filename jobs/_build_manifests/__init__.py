"""The build_manifests job's room: dataset manifests (manifests.py) and reading their sources (sources.py)."""
