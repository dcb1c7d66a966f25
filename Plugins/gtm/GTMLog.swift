import PylonCore
import PylonPluginKit

/// The plugin's logger: the SDK's levels (default warnings and errors), changeable at run time.
/// Lines at or above the level go to stderr and are published on `gtm.log`
/// `{level, message, ts}` for any client that subscribes.
final class GTMLog {
    let plugin: Plugin
    var level: GTMLogLevel
    static let topic = "gtm.log"

    init(plugin: Plugin, level: GTMLogLevel) {
        self.plugin = plugin
        self.level = level
    }

    func enabled(_ l: GTMLogLevel) -> Bool { level != .none && l.rank >= level.rank }

    func emit(_ l: GTMLogLevel, _ message: @autoclosure () -> String) {
        guard enabled(l) else { return }
        let m = message()
        switch l {
        case .error: plugin.log.error(m)
        case .warning: plugin.log.warn(m)
        case .info: plugin.log.info(m)
        default: plugin.log.debug(m)
        }
        plugin.publish(GTMLog.topic, ["level": .string(l.rawValue), "message": .string(m), "ts": .int(System.wallClockMs())])
    }

    func verbose(_ m: @autoclosure () -> String) { emit(.verbose, m()) }
    func debug(_ m: @autoclosure () -> String) { emit(.debug, m()) }
    func info(_ m: @autoclosure () -> String) { emit(.info, m()) }
    func warning(_ m: @autoclosure () -> String) { emit(.warning, m()) }
    func error(_ m: @autoclosure () -> String) { emit(.error, m()) }
}
