"""Brownfield adoption: import a running cluster's GPU sharing into a workspace, and show drift between Git and
the cluster."""
