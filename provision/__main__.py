from hotcache.provision.cli.app import main

main()
