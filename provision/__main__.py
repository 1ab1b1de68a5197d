from hotcache.provision.cli import main

main()
