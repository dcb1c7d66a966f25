import pylon_uploader

// pylon-uploader's entry point; the program is `UploaderMain.run()` (UploaderMain.swift), shared with `pylon`.
UploaderMain.run()
