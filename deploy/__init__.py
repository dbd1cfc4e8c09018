"""Deployment files (docker compose, Kubernetes) generated from the process plan."""
