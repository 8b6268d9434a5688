"""Load-test and test-only tools that stand in for real engine units; never used in serving."""
