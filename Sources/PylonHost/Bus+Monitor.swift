import PylonCore
import PylonProtocol

/// A connected monitor: its connection and its bound (`MonitorSink`).
struct MonitorEntry {
    let peer: Peer
    var sink: MonitorSink
}

/// Where a forwarded request's monitor events come from: kept by host id (`Bus.monitorTraces`) only while a
/// monitor is connected (so its answer can be reported with the method and latency).
struct MonitorTrace {
    let method: String
    let startNs: UInt64
}

/// `bus.monitor`: admin clients watch routed traffic (docs/PROTOCOL.md "Monitoring"). With no
/// monitor connected each hook is one test of `monitors.isEmpty` on the routing path; events
/// are built only for monitors whose pattern matches, and queued to them within their bound
/// (`maxMonitorQueuedBytes`): a monitor that does not read is disconnected, never waited for.
extension Bus {
    func monitorMethod(_ peer: Peer, _ params: JSON?) throws(RPCError) -> JSON {
        // Which clients may is the routing policy's (an operator method: admins unless a rule
        // says otherwise; a plugin cannot be a monitor: `RoutingPolicy.hostCallRefusal`).
        let filter = try MonitorFilter.parse(params)
        let limits = config.limits
        let sink = MonitorSink(filter: filter, maxQueuedBytes: limits.maxMonitorQueuedBytes)
        if let i = monitoring.monitors.firstIndex(where: { $0.peer === peer }) {
            monitoring.monitors[i].sink = sink  // a second call replaces the filter
        } else {
            guard monitoring.monitors.count < limits.maxMonitors else {
                throw RPCError(
                    .overloaded, "too many monitors (limit \(limits.maxMonitors))",
                    data: ["limit": "maxMonitors", "value": .int(Int64(limits.maxMonitors))])
            }
            monitoring.monitors.append(MonitorEntry(peer: peer, sink: sink))
        }
        log.info("monitor started", ["client": peer.id, "pattern": filter.pattern.text, "verbose": filter.verbose])
        return [
            "pattern": .string(filter.pattern.text), "verbose": .bool(filter.verbose),
            "maxQueuedBytes": .int(Int64(limits.maxMonitorQueuedBytes)),
        ]
    }

    func monitorRemove(_ peer: Peer) {
        guard monitoring.monitors.contains(where: { $0.peer === peer }) else { return }
        monitoring.monitors.removeAll { $0.peer === peer }
        if monitoring.monitors.isEmpty { monitoring.traces = [:] }
        log.info("monitor stopped", ["client": peer.id])
    }

    /// Queues the event `make` builds (at most once) to each monitor whose pattern matches
    /// `method`; drops the monitors that are over their bound.
    func monitorEmit(_ method: String, _ make: () -> MonitorEvent) {
        var event: MonitorEvent?
        var over: [Peer] = []
        let now = System.wallClockMs()
        for i in monitoring.monitors.indices {
            let filter = monitoring.monitors[i].sink.filter
            guard filter.wants(method), !monitoring.monitors[i].peer.closed else { continue }
            if event == nil { event = make() }
            let line = event!.line(seq: monitoring.monitors[i].sink.sent + 1, timeMs: now, verbose: filter.verbose)
            let conn = monitoring.monitors[i].peer.conn
            switch monitoring.monitors[i].sink.offer(bytes: line.count + 1, queuedBytes: conn.queuedBytes) {
            case .send: line.withUnsafeBytes { conn.sendLine($0) }
            case .drop: over.append(monitoring.monitors[i].peer)
            case .ignore: break
            }
        }
        for peer in over {
            counters.monitorsDropped += 1
            log.warn(
                "monitor disconnected: it does not read its events",
                ["client": peer.id, "queued_bytes": peer.conn.queuedBytes, "limit": "maxMonitorQueuedBytes"])
            peer.conn.close()
            peerClosed(peer)
        }
    }

    /// The raw text of top-level member `key` of `line`, when it is there (spelled plainly).
    static func memberText(_ line: UnsafeRawBufferPointer, _ key: StaticString) -> String? {
        RawJSON.memberValueSpan(line, key: key).map { String(decoding: UnsafeRawBufferPointer(rebasing: line[$0]), as: UTF8.self) }
    }

    func monitorRequest(_ from: Peer, _ principal: Principal, _ method: String, _ line: UnsafeRawBufferPointer, id: String, to: String) {
        monitorEmit(method) {
            MonitorEvent(
                .request, method: method, from: from.label, to: to, caller: callerJSON(principal), id: id, bytes: line.count,
                payload: Bus.memberText(line, "params"))
        }
    }

    /// A target's answer (`line`) to a traced request.
    func monitorReply(_ p: Pending, _ trace: MonitorTrace, _ line: UnsafeRawBufferPointer) {
        monitorEmit(trace.method) {
            var code: Int64?
            var message: String?
            if let e = RawJSON.memberValueSpan(line, key: "error") {
                let err = UnsafeRawBufferPointer(rebasing: line[e])
                code =
                    RawJSON.memberValueSpan(err, key: "code").flatMap { RawJSON.plainInt(err, $0) }
                    ?? Int64(RPCError.Code.internalError.rawValue)
                message = RawJSON.memberValueSpan(err, key: "message").flatMap { RawJSON.plainString(err, $0) }
            }
            return replyEvent(p, trace, bytes: line.count, code: code, message: message, payload: Bus.memberText(line, "result"))
        }
    }

    /// The host's error for a traced request (timeout, target gone, shutdown).
    func monitorReply(_ p: Pending, _ trace: MonitorTrace, error: RPCError) {
        monitorEmit(trace.method) {
            replyEvent(p, trace, bytes: 0, code: Int64(error.code), message: error.message, payload: nil)
        }
    }

    private func replyEvent(
        _ p: Pending, _ trace: MonitorTrace, bytes: Int, code: Int64?, message: String?, payload: String?
    ) -> MonitorEvent {
        let (to, id): (String, String?)
        switch p.origin {
        case .peer(let o, let originalId): (to, id) = (o.label, originalId)
        case .batch(let b, let originalId): (to, id) = (b.peer.label, originalId)
        case .host: (to, id) = ("host", nil)
        }
        let now = Loop.hrtimeNs
        return MonitorEvent(
            .reply, method: trace.method, from: p.target.label, to: to, caller: callerJSON(p.principal), id: id, bytes: bytes,
            latencyUs: now > trace.startNs ? (now - trace.startNs) / 1000 : 0, errorCode: code, errorMessage: message,
            payload: payload)
    }

    /// A request the host answered itself (a host method, or a refusal): its request and reply.
    func monitorHostAnswer(
        _ from: Peer, _ principal: Principal, _ method: String, _ line: UnsafeRawBufferPointer, id: String, startNs: UInt64,
        error: RPCError?
    ) {
        monitorRequest(from, principal, method, line, id: id, to: "host")
        monitorEmit(method) {
            let now = Loop.hrtimeNs
            return MonitorEvent(
                .reply, method: method, from: "host", to: from.label, caller: callerJSON(principal), id: id, bytes: 0,
                latencyUs: now > startNs ? (now - startNs) / 1000 : 0, errorCode: error.map { Int64($0.code) },
                errorMessage: error?.message)
        }
    }

    func monitorNotification(_ from: Peer, _ principal: Principal, _ method: String, _ line: UnsafeRawBufferPointer, to: Peer) {
        monitorEmit(method) {
            MonitorEvent(
                .notification, method: method, from: from.label, to: to.label, caller: callerJSON(principal), bytes: line.count,
                payload: Bus.memberText(line, "params"))
        }
    }

    func monitorPublication(_ topic: String, _ line: UnsafeRawBufferPointer, from: Peer?, delivered: Int) {
        monitorEmit(topic) {
            let caller = from.map { p in
                p.slot.map { #"{"plugin":"# + JSON.string($0.config.name).serialized + "}" } ?? callerJSON(.client(p))
            }
            return MonitorEvent(
                .publication, method: topic, from: from?.label ?? "host", to: nil, caller: caller ?? "{}", bytes: line.count,
                delivered: delivered, payload: Bus.memberText(line, "params"))
        }
    }
}
