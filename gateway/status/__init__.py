"""The live status page on the operator listener: the fleet at a glance, pushed as it changes."""
