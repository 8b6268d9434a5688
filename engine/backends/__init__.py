"""Engine backends besides the builtin one; each is imported only when selected."""
