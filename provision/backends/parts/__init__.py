"""What the backends are built from: the protocols they type against (`contract`), the
statistics they report (`stats`), their facts in the mapping (`state`), recorded devices
found again by identity (`recorded`), and the kernel interfaces two backends share or one
keeps apart from its plan (`dmtable`, `dmflush`, `bcache_sysfs`)."""
