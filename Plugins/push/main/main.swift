import pylon_push

// pylon-push's entry point; the program is `PushMain.run()` (PushMain.swift), shared with `pylon`.
PushMain.run()
