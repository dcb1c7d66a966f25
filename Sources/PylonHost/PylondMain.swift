import PylonCore
import PylonProtocol

/// pylond: the Pylon host daemon.
///
/// The daemon's whole program, as a library function: the `pylond` executable (Sources/pylond)
/// and the multi-call `pylon` binary (Sources/pylon) call it with their command line.
public enum Pylond {
    public static func main(_ arguments: [String]) -> Never {
        let usage = """
            usage: pylond [--config PATH] [--socket PATH] [--state-dir PATH] [--log-level LEVEL]
                          [--log-format FORMAT] [--check-config [PATH]] [--version] [--help]

              --config PATH        configuration file (default: $PYLON_CONFIG, else /etc/pylon/pylon.json)
              --socket PATH        client socket (overrides the config and $PYLON_SOCKET)
              --state-dir PATH     state directory (overrides the config and $PYLON_STATE_DIR)
              --log-level LEVEL    debug, info, warn or error
              --log-format FORMAT  auto (default: journal entries when stderr is the journal, else logfmt),
                                   logfmt, prefixed (logfmt with <N> priority prefixes) or journal;
                                   also $PYLON_LOG_FORMAT
              --check-config [PATH]  validate the configuration (JSON, settings, plugin executables) and exit
              --version            print the version and exit

            exit status: 0 ok; 1 runtime failure (socket, state directory); 2 usage error;
            78 (EX_CONFIG) invalid configuration. See pylond(8).
            """

        var configPath = System.env("PYLON_CONFIG") ?? "/etc/pylon/pylon.json"
        var socketOverride: String?
        var stateOverride: String?
        var levelOverride: String?
        var checkOnly = false
        var args = arguments.dropFirst().makeIterator()
        while let a = args.next() {
            func value() -> String {
                guard let v = args.next() else {
                    Log("pylond").error("missing value", ["option": a])
                    System.exit(2)
                }
                return v
            }
            switch a {
            case "--config", "-c": configPath = value()
            case "--socket": socketOverride = value()
            case "--state-dir": stateOverride = value()
            case "--log-level": levelOverride = value()
            case "--log-format":
                let f = value()
                if f == "auto" {
                    Log.output = Log.detectOutput { $0 == "PYLON_LOG_FORMAT" ? nil : System.env($0) }
                } else if let o = Log.Output(rawValue: f) {
                    Log.output = o
                } else {
                    Log.writeRaw("pylond: --log-format must be auto, logfmt, prefixed or journal, not \(f)\n")
                    System.exit(2)
                }
            case "--check-config": checkOnly = true
            case "--version": print("pylond \(pylonVersion)"); System.exit(0)
            case "-h", "--help": print(usage); System.exit(0)
            case _ where checkOnly && !a.hasPrefix("-"):
                configPath = a  // `pylond --check-config /etc/pylon/pylon.json`
            default:
                Log.writeRaw("pylond: unknown option \(a) (see pylond --help)\n")
                System.exit(2)
            }
        }

        var config: HostConfig
        do throws(ConfigError) {
            config = try HostConfig.load(path: configPath)
        } catch {
            if checkOnly {
                Log.writeRaw("pylond: \(error.description)\n")
            } else {
                Log("pylond").error("invalid configuration", ["path": configPath, "error": error.description])
            }
            System.exit(exitStatusConfigError)  // EX_CONFIG
        }
        if let s = socketOverride { config.socketPath = s }
        if let s = stateOverride { config.stateDir = s }
        if let l = levelOverride { config.logLevel = l }
        guard let level = Log.Level(name: config.logLevel) else {
            Log("pylond").error("invalid log level: must be debug, info, warn or error", ["level": config.logLevel])
            System.exit(2)
        }
        Log.minimum = level
        if checkOnly {
            // The host's settings were read above; then each plugin's executable, then each
            // plugin's own strict reader of its `config` (`PLUGIN --check-config`).
            // A plugin's problem is shown at its line (`PATH:LINE: plugin NAME: …`).
            let problems = config.executableProblems().map { "\(configPath): \($0)" }
            let plugins = config.pluginConfigChecks()
            let text = (try? System.readFile(atPath: configPath)) ?? []
            for w in plugins.warnings { Log.writeRaw("pylond: \(configPath): warning: \(w)\n") }
            for p in problems + HostConfig.located(plugins.problems, path: configPath, text: text) { Log.writeRaw("pylond: \(p)\n") }
            if !problems.isEmpty || !plugins.problems.isEmpty { System.exit(exitStatusConfigError) }
            print("configuration ok: \(config.plugins.count) plugins, socket \(config.socketPath)")
            System.exit(0)
        }
        let host = Host(config: config, configPath: configPath)
        host.overrides = (socketOverride, stateOverride, levelOverride)
        System.exit(host.run())
    }
}
