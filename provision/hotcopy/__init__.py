"""Hot copies: the on-disk format, selection, staging, the file copy, publishing, verification and the catalog of copies."""
