"""Recursive models: cells over trees, DAGs and sequences, each input structure run as one
accelerator program (CORTEX's approach; docs/recursive.md)."""
