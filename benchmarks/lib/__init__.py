"""Helpers of the benchmark scripts (not scripts themselves: no smoke case)."""
