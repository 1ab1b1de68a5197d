"""Probes of block devices: what is on them, who uses them."""
