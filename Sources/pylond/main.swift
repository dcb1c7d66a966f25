import PylonHost

// pylond's entry point; the program is `Pylond.main` (Sources/PylonHost/PylondMain.swift), shared
// with the multi-call `pylon` binary.
Pylond.main(CommandLine.arguments)
