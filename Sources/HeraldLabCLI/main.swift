import ArgumentParser
HeraldLab.main()
