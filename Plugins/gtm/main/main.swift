import pylon_gtm

// pylon-gtm's entry point; the program is `GTMMain.run()` (GTMMain.swift), shared with `pylon`.
GTMMain.run()
