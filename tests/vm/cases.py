"""The guest test cases, named once: the guest modules define them and the host-side
test expects each one in the guest's JUnit report (a case that did not run fails)."""

BACKENDS = ("bcache", "dm-cache", "lvmcache")
BOOT1 = ("test_apply", "test_held_device_is_refused_even_with_wipe",
         "test_second_apply_changes_nothing", "test_write_and_read_back",
         "test_data_root_names_the_cache", "test_status_shows_hits",
         "test_warm_fills_the_cache", "test_mode_change_in_place",
         "test_teardown_writeback_loses_nothing", "test_prepare_reboot")
BOOT1_ONCE = ("test_lvmcache_attaches_to_existing_lv", "test_flush_timeout_leaves_the_dirty_cache")
BOOT2 = ("test_restore_after_reboot", "test_restore_again_changes_nothing")
# After boot 1's pytest, guest/powercut.py cuts the power during one hot copy and right
# after another; boot 2 checks what is on disk.
BOOT2_ONCE = ("test_hot_copies_survive_the_power_cut",)
# Guest disks: each backend gets its own partition pair (SSD part N in front of HDD part N);
# pair 4 holds an existing LV that lvmcache attaches to; HDD parts 5 and 6 hold the
# power-cut hot copies (plain XFS, which wants 300 MiB at least).
PARTITION = {"bcache": 1, "dm-cache": 2, "lvmcache": 3}
EXISTING_LV_PARTITION = 4
POWERCUT_PARTITIONS = (5, 6)
SSD_MIB, HDD_MIB = 320, 2688
# the last partition of each disk takes the rest
SSD_PARTS_MIB, HDD_PARTS_MIB = (80, 80, 80), (480, 480, 480, 543, 330)
# Storage safety (docs/safety.md): its own pair of boots on fresh images, four disks given in
# another order the second time (ssd, hdd, ssd2, by -> by, hdd, ssd, ssd2), so kernel names
# move: the SSD's old names (vda1, vda2) now name the bystander's ext4 partitions, ssd2's
# old names (vdc1, vdc2) name the SSD's partitions (bcache's SSD, the first dm-cache's SSD).
SAFETY_BOOT1 = ("test_bystander_holds_ext4_data", "test_build_on_kernel_names", "test_shutdown",
                "test_origin_failing_during_teardown_keeps_everything[bcache-3]",
                "test_origin_failing_during_teardown_keeps_everything[dm-cache-4]",
                "test_failed_ssd_named_and_torn_down[bcache-3-5]",
                "test_failed_ssd_named_and_torn_down[dm-cache-4-6]",
                "test_failed_writeback_ssd_needs_the_loss_acknowledged",
                "test_failover_keeps_the_filesystem_mounted_and_readers_reading",
                "test_lvmcache_switched_to_its_origin_is_left_so_for_the_reboot")
SAFETY_BOOT2 = ("test_disks_changed_order", "test_teardown_of_a_cache_not_loaded_is_refused",
                "test_restore_finds_each_cache_by_identity",
                "test_teardown_after_restore_puts_every_file_on_the_origin",
                "test_lvmcache_records_its_pv_vg_and_lv_uuids",
                "test_lvmcache_lv_renamed_between_boots_is_refused_and_nothing_is_wiped",
                "test_swapped_equal_size_ssds_are_never_mixed_up_and_a_failed_restore_mounts_nothing",
                "test_a_cache_on_its_origin_is_mounted_from_the_origin_after_the_reboot",
                "test_lvmcache_on_its_origin_is_mounted_from_its_lv_after_the_reboot",
                "test_lvmcache_failed_ssd_named_torn_down_and_a_new_one_attached")
SAFETY_ORDERS = (("ssd", "hdd", "ssd2", "by"), ("by", "hdd", "ssd", "ssd2"))
BYSTANDER_MIB = 192
SSD2_MIB, SSD2_PARTS_MIB = 420, (320, 80)      # part 1: an origin (XFS needs 300 MiB), 2: its cache
