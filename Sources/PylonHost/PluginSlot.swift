import PylonCore
import PylonProtocol

/// Everything the host keeps about one configured plugin: its supervision state machine, and
/// what the machine's actions act on — the process, the channel's peer and one timer per kind.
final class PluginSlot {
    var config: PluginConfig
    var life: PluginLifecycle {
        didSet {
            revision &+= 1
            if oldValue.state != life.state { onStateChange?() }
        }
    }
    /// Called when `life.state` changes (`Bus` drains `waiting` then: Bus+StartWait.swift).
    var onStateChange: (() -> Void)?
    /// Requests waiting for the plugin to run (`starting`, `backoff`), and the timer of the
    /// earliest one's deadline.
    var waiting = StartWaitQueue<ParkedRequest>()
    var waitTimer: Timer?
    /// Bumped by every change of `life` or `manifest`: the cached reports that show them
    /// (`ReportCache`) are built again.
    private(set) var revision: UInt64 = 0
    /// The current process, or the last one until the next spawn (its late output lines are
    /// still sorted by `output`).
    var process: ChildProcess?
    var peer: Peer?
    var manifest: Manifest? {
        didSet {
            revision &+= 1
            wantsCallerInfo = manifest?.callerInfo ?? false
            continuing = Set((manifest?.methods ?? [:]).values.filter(\.continuesAfterDeadline).map(\.name))
            // The docs stay in the manifest (bus.describe): the route copies no more than before.
            methods = (manifest?.methods ?? [:]).mapValues {
                var spec = $0
                spec.doc = nil
                return MethodRoute(spec: spec, consent: ConsentTemplate($0.consent))
            }
            checkedParams = (manifest?.methods ?? [:]).compactMapValues { $0.doc?.hostChecksParams == true ? $0.doc : nil }
        }
    }
    /// The docs of the methods whose params the host checks (`MethodDoc.hostChecksParams`;
    /// Bus+ParamCheck.swift), by full name; empty for most plugins.
    private(set) var checkedParams: [String: MethodDoc] = [:]
    /// From the manifest, kept apart so the routing hot path does not copy the manifest.
    private(set) var wantsCallerInfo = false
    /// The methods whose requests the plugin carries on with after the deadline
    /// (`Manifest.Method.continuesAfterDeadline`): their timeout is answered `-32008`, pending.
    private(set) var continuing: Set<String> = []
    /// What the router needs of each method the manifest lists (none listed: every method of
    /// the namespace goes to the plugin).
    private(set) var methods: [String: MethodRoute] = [:]

    /// A manifest method with its consent template taken apart (`ConsentTemplate`).
    struct MethodRoute {
        let spec: Manifest.Method
        let consent: ConsentTemplate
    }
    var served: UInt64 = 0
    /// A level set at run time (`bus.logLevel`): the plugin's `PYLON_LOG_LEVEL` at its restarts too.
    var logLevel: String?
    /// Sorts the current process's stdout/stderr lines (crash reports condensed).
    var output = PluginOutputFilter()
    /// Set on a slot retired by a reload while its process is still exiting: the slot that
    /// replaces it, started once this process is gone (two copies never share the state directory).
    weak var successor: PluginSlot?
    private var timers: [PluginLifecycle.TimerKind: Timer] = [:]

    init(config: PluginConfig, seed: UInt64) {
        self.config = config
        life = PluginLifecycle(policy: config.policy, seed: seed)
    }

    deinit { closeTimers() }

    /// Starts the timer of `kind` (created on first use with `fire`) to fire after `ms`, then
    /// every `repeatMs` if non-zero.
    func armTimer(
        _ kind: PluginLifecycle.TimerKind, afterMs ms: UInt64, repeatMs: UInt64, loop: Loop,
        fire: @escaping () -> Void
    ) {
        let timer = timers[kind] ?? Timer(loop: loop, fire)
        timers[kind] = timer
        timer.start(after: ms, repeat: repeatMs)
    }

    func cancelTimer(_ kind: PluginLifecycle.TimerKind) { timers[kind]?.stop() }

    func closeTimers() {
        for t in timers.values { t.close() }
        timers.removeAll()
        waitTimer?.close()
        waitTimer = nil
    }

    func unavailableError() -> RPCError {
        let name = config.name
        switch life.state {
        case .starting:
            return RPCError(.pluginUnavailable, "plugin \(name) is starting", data: ["plugin": .string(name), "state": "starting"])
        case .backoff:
            return RPCError(.pluginUnavailable, "plugin \(name) is restarting", data: ["plugin": .string(name), "state": "backoff"])
        case .failed:
            return RPCError(
                .pluginUnavailable, "plugin \(name) has failed: \(life.failedReason ?? "unknown")",
                data: ["plugin": .string(name), "state": "failed"])
        case .stopped, .running:
            return RPCError(
                .pluginUnavailable, "plugin \(name) is not running", data: ["plugin": .string(name), "state": .string(life.state.rawValue)])
        }
    }
}
