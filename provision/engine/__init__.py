"""spec -> plan -> apply, restore, teardown and status: the provisioning engine."""
