import PylonCore
import PylonHost

/// pylond: the Pylon host daemon.
let usage = """
    usage: pylond [--config PATH] [--socket PATH] [--state-dir PATH] [--log-level LEVEL] [--check-config]

      --config PATH      configuration file (default: $PYLON_CONFIG, else /etc/pylon/pylon.json)
      --socket PATH      client socket (overrides the config and $PYLON_SOCKET)
      --state-dir PATH   state directory (overrides the config and $PYLON_STATE_DIR)
      --log-level LEVEL  debug, info, warn or error
      --check-config     validate the configuration and exit
    """

var configPath = System.env("PYLON_CONFIG") ?? "/etc/pylon/pylon.json"
var socketOverride: String?
var stateOverride: String?
var levelOverride: String?
var checkOnly = false
var args = CommandLine.arguments.dropFirst().makeIterator()
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
    case "--check-config": checkOnly = true
    case "--version": print("pylond \(pylonVersion)"); System.exit(0)
    case "-h", "--help": print(usage); System.exit(0)
    default:
        print(usage)
        System.exit(2)
    }
}

var config: HostConfig
do throws(ConfigError) {
    config = try HostConfig.load(path: configPath)
} catch {
    Log("pylond").error("invalid configuration", ["path": configPath, "error": error.description])
    System.exit(78)  // EX_CONFIG
}
if let s = socketOverride { config.socketPath = s }
if let s = stateOverride { config.stateDir = s }
if let l = levelOverride { config.logLevel = l }
guard let level = Log.Level(name: config.logLevel) else {
    Log("pylond").error("invalid log level", ["level": config.logLevel])
    System.exit(2)
}
Log.minimum = level
if checkOnly {
    print("configuration ok: \(config.plugins.count) plugins, socket \(config.socketPath)")
    System.exit(0)
}
let host = Host(config: config, configPath: configPath)
host.overrides = (socketOverride, stateOverride, levelOverride)
System.exit(host.run())
