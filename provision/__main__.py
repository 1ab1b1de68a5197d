from hotcache.provision.cli.commands import main

main()
