import PylonCore
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// Writes `bus.status` and every running plugin's `<plugin>.status` as Prometheus text to
/// `metricsTextfile` every `metricsIntervalMs`, for node_exporter's textfile collector. The file
/// is replaced atomically (written to `<path>.tmp`, then renamed), so the collector never reads a
/// half-written file. One round at a time: a round waits for the plugins' replies (at most 5 s).
final class MetricsExporter {
    unowned let bus: Bus
    let path: String
    private var timer: Timer?
    private var round = 0
    private var inRound = false
    private let log = Log("metrics")
    static let pluginReplyTimeoutMs: UInt64 = 5_000
    /// 0640: the metrics name every user's AppKeys and streams, so only the host's user and
    /// group read them (add node_exporter's user to the `pylon` group).
    static let fileMode: mode_t = 0o640
    /// The host asks for every owner's figures, as its own uid and an admin: a plugin's status
    /// shows a caller without a uid its own state only (the tag manager gave no `totals`).
    static let statusCaller = CallerInfo(uid: Int64(getuid()), gid: Int64(getgid()), pid: Int64(getpid()), admin: true)

    init(bus: Bus, path: String, intervalMs: UInt64) {
        self.bus = bus
        self.path = path
        // Unref'd: the exporter never keeps the loop alive during shutdown.
        timer = Timer(loop: bus.loop, unref: true) { [unowned self] in self.tick() }
        timer?.start(after: min(intervalMs, 2_000), repeat: intervalMs)
    }

    func close() {
        timer?.close()
        timer = nil
    }

    private func tick() {
        guard !inRound, !bus.hostState.shuttingDown else { return }
        inRound = true
        round += 1
        let thisRound = round
        let status = bus.status(for: nil, .host)
        var targets: [(String, Peer)] = []
        for name in bus.pluginSet.slotOrder {
            guard let s = bus.pluginSet.slots[name], s.life.state == .running, let peer = s.peer, !peer.closed,
                s.manifest?.methods[name + ".status"] != nil
            else { continue }
            targets.append((name, peer))
        }
        var replies: [String: JSON] = [:]
        var outstanding = targets.count
        // Weak: a reload may replace this exporter while a round waits for plugins.
        let finish = { [weak self] in
            guard let self, self.round == thisRound, self.inRound else { return }
            self.inRound = false
            let ordered = targets.compactMap { t in replies[t.0].map { (t.0, $0) } }
            self.write(MetricsText.render(bus: status, plugins: ordered))
        }
        if targets.isEmpty { finish(); return }
        for (name, peer) in targets {
            _ = bus.call(peer, method: name + ".status", params: nil, timeoutMs: Self.pluginReplyTimeoutMs, caller: Self.statusCaller) {
                r in
                if case .success(let v) = r { replies[name] = v }
                outstanding -= 1
                if outstanding == 0 { finish() }
            }
        }
    }

    private func write(_ text: String) {
        // `fileMode` (0640): node_exporter's user reads it as a member of the host's group.
        do throws(IOError) {
            try System.writeFileAtomically(atPath: path, contents: Array(text.utf8), mode: MetricsExporter.fileMode)
        } catch {
            log.warn("cannot write metrics textfile", ["path": path, "error": error.description])
        }
    }
}
