import PylonCore
import PylonHost
import PylonPluginKit
import pylon_gtm
import pylon_ma
import pylon_push
import pylon_uploader

/// pylon: the device's programs in one executable, chosen by the name it is started as (like
/// busybox and systemd): `pylond` and the plugins `pylon-uploader`, `pylon-ma`, `pylon-push`,
/// `pylon-gtm` are links to it, so the host and its four plugins share one copy of the code and
/// the Swift runtime in memory. `pylon NAME [ARGS…]` runs NAME too (`pylon pylond --version`).
/// Runs a plugin's program with `arguments` as its command line (`--help`, `--version`).
func plugin(_ arguments: [String], _ run: () -> Never) -> Never {
    Plugin.commandLine = arguments
    run()
}

let programs: [String: ([String]) -> Never] = [
    "pylond": { Pylond.main($0) },
    "pylon-uploader": { plugin($0, UploaderMain.run) },
    "pylon-ma": { plugin($0, MAMain.run) },
    "pylon-push": { plugin($0, PushMain.run) },
    "pylon-gtm": { plugin($0, GTMMain.run) },
]

var arguments = CommandLine.arguments
let invokedAs = arguments.first.map { String($0.split(separator: "/").last ?? "") } ?? ""
if let program = programs[invokedAs] { program(arguments) }
if arguments.count > 1, let program = programs[arguments[1]] {
    arguments.removeFirst()
    program(arguments)
}
let names = programs.keys.sorted().joined(separator: ", ")
if arguments.count > 1, arguments[1] == "--help" || arguments[1] == "-h" {
    print("usage: pylon PROGRAM [ARGS…], or started through a link named PROGRAM\nprograms: \(names)")
    System.exit(0)
}
if arguments.count > 1, arguments[1] == "--version" { print("pylon \(pylonVersion)"); System.exit(0) }
Log.writeRaw("pylon: started as \"\(invokedAs)\"; run it as one of \(names) (a link of that name, or `pylon NAME`)\n")
System.exit(2)
