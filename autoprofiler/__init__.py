"""autoprofiler."""
