import PylonCore

/// `--help` and `--version` for every plugin executable, so a person who runs one by hand learns
/// what it is instead of getting "PYLON_BUS_FD is not set".
extension Plugin {
    /// Answers `--version` / `--help` (exit 0) and refuses other arguments when the plugin was not
    /// started by the host (exit 64, EX_USAGE); under the host (`PYLON_BUS_FD` set) arguments
    /// are the configured `args` and are left to the plugin.
    /// The program's command line: `CommandLine.arguments`, or what the multi-call `pylon`
    /// binary sets before `run()` (`pylon pylon-ma --help` is `pylon-ma --help`). Read once, on
    /// the loop thread, before the loop starts.
    nonisolated(unsafe) public static var commandLine: [String] = CommandLine.arguments

    func handleCommandLine(_ arguments: [String] = Plugin.commandLine) {
        let exe = arguments.first.map { String($0.split(separator: "/").last ?? Substring($0)) } ?? "pylon-\(name)"
        let args = arguments.dropFirst()
        if args.contains("--version") {
            print("\(exe) \(version)")
            System.exit(0)
        }
        if args.contains("--help") || args.contains("-h") {
            print(helpText(exe))
            System.exit(0)
        }
        if args.contains("--check-config") { checkConfigAndExit(exe) }
        if System.env("PYLON_BUS_FD") == nil, let a = args.first {
            Log.writeRaw("\(exe): unknown argument \(a) (try --help)\n")
            System.exit(64)
        }
    }

    /// `PLUGIN --check-config`: reads the plugin's `config` (JSON) from stdin, runs the plugin's
    /// strict reader (`checkConfig`) on it and prints each problem (stderr), an unknown setting
    /// being one here; exits 0 when it would start and every setting is known, 78 (EX_CONFIG)
    /// otherwise. `pylond --check-config` (and a reload) runs this for every enabled plugin.
    func checkConfigAndExit(_ exe: String) -> Never {
        let config: JSON
        do {
            let bytes = try System.readFile(atPath: "/dev/stdin", maxBytes: 16 << 20)
            config = bytes.isEmpty ? .object([:]) : try JSON.parse(String(decoding: bytes, as: UTF8.self))
        } catch {
            Log.writeRaw("\(exe): --check-config: the config on stdin is not JSON: \(error)\n")
            System.exit(exitStatusConfigError)
        }
        guard let check = checkConfig else {
            print("warning: \(exe) has no configuration checker; its settings are not checked before start")
            System.exit(0)
        }
        do throws(ConfigProblems) {
            // A setting no reader asked for is an error here (a typo would otherwise pass the
            // check and be ignored at start, where it stays a warning).
            let unknown = try check(config)
            if unknown.isEmpty {
                print("config ok")
                System.exit(0)
            }
            for p in unknown { Log.writeRaw("\(p)\n") }
            System.exit(exitStatusConfigError)
        } catch {
            for p in error.problems + error.warnings { Log.writeRaw("\(p)\n") }
            System.exit(exitStatusConfigError)
        }
    }

    func helpText(_ exe: String) -> String {
        var t = """
            \(exe) \(version): the Pylon "\(name)" plugin.

            It is started and supervised by pylond (the Pylon host), which hands it its bus channel
            (PYLON_BUS_FD) and its configuration; it is not meant to be run by hand. Configure it in
            the "plugins" list of /etc/pylon/pylon.json (see pylon.json(5)) and call its methods
            through the host, e.g. `pylonctl describe` or `pylonctl call \(name).METHOD '{...}'`.

            options:
              --help      this text
              --version   print the version and exit
              --check-config  read the plugin's config (JSON) from stdin, check it, exit 0 or 78
            """
        let listed = methodOrder
        if !listed.isEmpty {
            t += "\n\nmethods:\n" + listed.map { "  " + $0 }.joined(separator: "\n")
        }
        return t
    }
}
