import CJSONC
import PylonCore
import PylonProtocol

/// Forwarded requests in flight (`PendingTable`): backpressure before forwarding, the host's own
/// calls, answers taken from the table, failures (a closed target, a timeout) and the single
/// timeout timer armed for the earliest deadline.
extension Bus {
    /// When `target` is congested: defers `peer`'s current line and holds its input until the
    /// target drains; returns true (the caller routes nothing now).
    func deferIfCongested(_ peer: Peer, _ target: Peer) -> Bool {
        guard target.conn.isCongested else { return false }
        // A batch member cannot wait alone (the line holds the members already sent): the
        // batch goes through, and the peer's input is held after it (`handleBatch`).
        if let b = forwarder.currentBatch, b.peer === peer {
            b.congested = target
            return false
        }
        peer.conn.hold(until: target.conn)
        peer.conn.deferCurrentLine()
        counters.heldForCongestion += 1
        return true
    }

    /// Issues a request from the host itself (heartbeats, callbacks to providers); `caller`: the
    /// `_pylon` it carries (none: the plugin sees a caller without uid or plugin).
    func call(
        _ target: Peer, method: String, params: JSON?, timeoutMs: UInt64, caller: CallerInfo? = nil,
        _ done: @escaping (Result<JSON, RPCError>) -> Void
    ) -> Int64 {
        let hostId = forwarder.nextRequestId
        forwarder.nextRequestId += 1
        addPending(hostId, Pending(origin: .host(done), target: target), deadlineMs: loop.nowMs + timeoutMs)
        target.conn.send(envelope: Envelope.request(id: .int(hostId), method: method, params: .params(params), caller: caller))
        return hostId
    }

    func handleResponse(_ peer: Peer, _ msg: JSONRef, _ line: UnsafeRawBufferPointer, id: OpaquePointer?, idSpan: Range<Int>) {
        guard json_object_get_type(id) == json_type_int, case let hostId = json_object_get_int64(id),
            let p = takePending(hostId, answeredBy: peer)
        else {
            log.debug("reply to an unknown request ignored", ["peer": peer.label])
            return
        }
        if !monitoring.monitors.isEmpty, let t = monitoring.traces.removeValue(forKey: hostId) { monitorReply(p, t, line) }
        switch p.origin {
        case .peer(let origin, let originalId):
            settleAnswers(hostId, succeeded: msg.has("result") && !msg.has("error"), plugin: origin)
            relayResponse(line, idSpan: idSpan, to: origin, originalId: originalId)
        case .batch(let b, let originalId): relayToBatch(line, idSpan: idSpan, b, originalId: originalId)
        case .host(let done): done(msg.responseResult)
        }
    }

    /// Removes and returns the pending request `hostId` if `peer` is the one it was sent to.
    func takePending(_ hostId: Int64, answeredBy peer: Peer, if accept: (Pending) -> Bool = { _ in true }) -> Pending? {
        guard let p = forwarder.pending.remove(hostId, if: { $0.target === peer && accept($0) }) else { return nil }
        peer.slot?.served += 1
        return p
    }

    /// Fails every request `peer` was serving (it closed), in id order: taken from the table's
    /// by-target index, not found by a scan.
    func failPending(targeting peer: Peer, _ error: RPCError) {
        for (id, p) in forwarder.pending.takeAll(targeting: peer.id) { finish(id, p, error) }
    }

    /// Answers a pending request with an error (plugin death, timeout).
    func complete(_ id: Int64, _ error: RPCError) {
        guard let p = forwarder.pending.remove(id) else { return }
        finish(id, p, error)
    }

    private func finish(_ id: Int64, _ p: Pending, _ error: RPCError) {
        if !monitoring.monitors.isEmpty, let t = monitoring.traces.removeValue(forKey: id) { monitorReply(p, t, error: error) }
        if !forwarder.pendingAnswers.isEmpty { forwarder.pendingAnswers[id] = nil }  // not a success: its plugin answers them
        switch p.origin {
        case .peer(let origin, let originalId):
            origin.inflight -= 1
            guard !origin.closed else { return }
            sendError(origin.conn, idText: originalId, error)
            if origin.conn.peerShutdown { closeIfDone(origin) }
        case .batch(let b, let originalId):
            var idText = originalId
            idText.withUTF8 { id in
                Envelope.error(id: .text(UnsafeRawBufferPointer(id)), error).withUnsafeBytes { batchMemberAnswered(b, $0) }
            }
        case .host(let done):
            done(.failure(error))
        }
    }

    func addPending(_ id: Int64, _ p: Pending, deadlineMs: UInt64) {
        forwarder.pending.insert(id, p, target: p.target.id, deadlineMs: deadlineMs)
        if let armed = forwarder.sweepArmedForMs, armed <= deadlineMs { return }  // the usual case: no work
        arm(deadlineMs)
    }

    /// Arms the timeout timer for the earliest pending deadline; with nothing pending it stays
    /// idle: an idle host does not wake up for timeouts.
    private func armSweep() {
        guard let next = forwarder.pending.nextDeadline() else { return }
        arm(next)
    }

    private func arm(_ deadlineMs: UInt64) {
        forwarder.sweepArmedForMs = deadlineMs
        // At least 1 ms: a zero timer started from the timer's own callback would run again in
        // the same loop phase.
        forwarder.sweepTimer.start(after: max(1, deadlineMs > loop.nowMs ? deadlineMs - loop.nowMs : 0))
    }

    func sweepTimeouts() {
        for (id, p) in forwarder.pending.expired(nowMs: loop.nowMs) {
            if !p.isHostCall { counters.timeouts += 1 }
            guard !p.continues else {
                // Not a failure: the plugin carries on with the request and its effect still
                // happens (docs/PROTOCOL.md "Pending answers").
                finish(
                    id, p,
                    RPCError(
                        .pending, "\(p.target.label) is still working on it: it will take effect; no later answer is sent",
                        data: ["target": .string(p.target.label), "pending": true]))
                continue
            }
            finish(id, p, RPCError(.timeout, "no reply from \(p.target.label) in time", data: ["target": .string(p.target.label)]))
        }
        armSweep()
    }
}
