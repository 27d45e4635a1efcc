"""A Redis and a fleet started on this machine, for the demo, the bench and the tests."""
