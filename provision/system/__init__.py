"""The operating system underneath: running programs, bounded waits, atomic writes and locks, fstab, filesystem calls, sizes, progress."""
