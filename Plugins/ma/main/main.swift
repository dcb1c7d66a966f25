import pylon_ma

// pylon-ma's entry point; the program is `MAMain.run()` (MAMain.swift), shared with `pylon`.
MAMain.run()
