"""Rollouts: replacing one revision of the units by another, cell by cell, judged by gates."""
