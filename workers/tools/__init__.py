"""Operator tools on top of a fleet: bench, demo, bulk jobs, top."""
