"""What hotcache does to running caches on its own, as root: warm them (read a dataset
through the cache until it holds it) and fail them over (switch a dm-cache or lvmcache
whose SSD failed to its origin under the mounted filesystem)."""
