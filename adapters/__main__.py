"""`python -m hotcache.adapters`: log the data_root line for DATA_ROOT and exit 1 unless
it is what DATA_ROOT_EXPECT asks (a job's first command, or an init container)."""

from hotcache.adapters.dataroot import main

raise SystemExit(main())
