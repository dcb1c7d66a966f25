/// The methods the host itself serves and the topics it publishes (docs/PROTOCOL.md). Plugins,
/// clients and pylonctl name them through these constants; the host's dispatch table matches on
/// them.
public enum HostMethod {
    /// A plugin's handshake, its first message (params: `HelloParams`; result: `Welcome`).
    public static let hello = "bus.hello"
    /// The host's liveness probe of a plugin (answered `{}`).
    public static let heartbeat = "bus.heartbeat"
    /// Notification from the host to a plugin: finish up and exit.
    public static let shutdown = "bus.shutdown"

    public static let ping = "bus.ping"
    public static let status = "bus.status"
    public static let describe = "bus.describe"
    public static let subscribe = "bus.subscribe"
    public static let unsubscribe = "bus.unsubscribe"
    public static let publish = "bus.publish"
    public static let provide = "bus.provide"
    public static let unprovide = "bus.unprovide"
    public static let restart = "bus.restart"
    public static let consentGet = "consent.get"
    public static let consentSet = "consent.set"
    public static let consentSetApp = "consent.setApp"
    public static let consentList = "consent.list"
    /// Returns a switch to "never set" (`{"key", "layer"?: "operator"|"app"}`); allowed to whoever
    /// may call `consent.set`.
    public static let consentClear = "consent.clear"
    /// Admins: the calling connection receives a `bus.monitor.event` notification for each
    /// routed request, reply, notification and publication whose method matches `pattern`.
    public static let monitor = "bus.monitor"
    /// The notification a monitor receives (params: one event; docs/PROTOCOL.md "Monitoring").
    public static let monitorEvent = "bus.monitor.event"
    /// Admins (and the host's own uid): re-read the configuration, as SIGHUP does, and answer
    /// what changed, what could not be applied, or why the new configuration was refused.
    public static let reload = "bus.reload"
    /// Admins: set the host's log level, or a plugin's (`plugin`). Also the host→plugin
    /// notification (params `{"level"}`) the plugin kit handles by setting its own level.
    public static let logLevel = "bus.logLevel"

    /// What `bus.describe` lists as the host's own methods, in this order.
    public static let served = [
        ping, status, describe, subscribe, unsubscribe, publish, provide, unprovide, restart,
        consentGet, consentSet, consentSetApp, consentList, consentClear, monitor, reload, logLevel,
    ]

    /// `bus.*` and `consent.*` are the host's: never a plugin's or a provider's.
    public static func isHostNamespace(_ method: String) -> Bool {
        method.hasPrefix("bus.") || method.hasPrefix("consent.")
    }
}

/// Topics the host publishes.
public enum HostTopic {
    /// `{"key", "granted", "master"}` after any consent change; every plugin receives it.
    public static let consentChanged = "consent.changed"
    /// `{"plugin", "status"|"signal", "state", "restartInMs"?}` when a plugin process ends.
    public static let pluginExited = "bus.plugin.exited"
    /// `{"client": N}` when a client connection closes.
    public static let clientClosed = "bus.client.closed"
}

/// The exit status a plugin uses to say "my configuration is wrong; do not restart me"
/// (sysexits' EX_CONFIG): the host marks it failed instead of restarting it.
public let exitStatusConfigError: Int32 = 78
