import PylonCore
import PylonProtocol

/// Everything the host keeps about one configured plugin: its supervision state machine, the
/// live process and channel, and the manifest from its last handshake.
final class PluginSlot {
    var config: PluginConfig
    var life: PluginLifecycle
    var process: ChildProcess?
    var peer: Peer?
    var manifest: Manifest? {
        didSet { wantsCallerInfo = manifest?.callerInfo ?? false }
    }
    /// From the manifest, kept apart so the routing hot path does not copy the manifest.
    private(set) var wantsCallerInfo = false
    var pid: Int32 = 0
    var served: UInt64 = 0
    /// One timer per concern: start deadline / backoff / stop grace share `timer`.
    var timer: Timer?
    var heartbeat: Timer?
    var heartbeatOutstanding: Int64?
    var heartbeatSentAtMs: UInt64 = 0
    var lastHeartbeatRttMs: UInt64?
    var everLeftStarting = false
    var lastExit: String?
    /// Sorts the current process's stdout/stderr lines (crash reports condensed).
    var output = PluginOutputFilter()
    /// Set on a slot retired by a reload while its process is still exiting: starts the
    /// replacement once this process is gone (two copies never share the state directory).
    var onGone: (() -> Void)?

    init(config: PluginConfig, seed: UInt64) {
        self.config = config
        life = PluginLifecycle(policy: config.policy, seed: seed)
    }

    deinit {
        timer?.close()
        heartbeat?.close()
    }

    func unavailableError() -> RPCError {
        let name = config.name
        switch life.state {
        case .starting:
            return RPCError(.pluginUnavailable, "plugin \(name) is starting", data: ["plugin": .string(name), "state": "starting"])
        case .backoff:
            return RPCError(.pluginUnavailable, "plugin \(name) is restarting", data: ["plugin": .string(name), "state": "backoff"])
        case .failed:
            return RPCError(.pluginUnavailable, "plugin \(name) has failed: \(life.failedReason ?? "unknown")",
                            data: ["plugin": .string(name), "state": "failed"])
        case .stopped, .running:
            return RPCError(.pluginUnavailable, "plugin \(name) is not running", data: ["plugin": .string(name), "state": .string(life.state.rawValue)])
        }
    }
}
