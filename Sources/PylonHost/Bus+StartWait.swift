import PylonCore
import PylonProtocol

/// A request that waits for its plugin to start (`StartWaitQueue`): what handling it again needs.
struct ParkedRequest {
    let peer: Peer
    let principal: Principal
    let line: [UInt8]
    let method: String
    let idSpan: Range<Int>
    let answersSpan: Range<Int>?
}

/// Calls wait for a plugin that is `starting` or in `backoff` (issue 36 item 3; docs/PROTOCOL.md
/// "Calls to a plugin that is starting"): the thin shell of `StartWaitQueue`. A refused request
/// for such a plugin is parked in its slot instead of answered -32001; when the plugin runs the
/// parked requests are handled again in order (routing, permission and consent judged then);
/// at a request's deadline it is answered -32002; when the plugin ends `failed` or `stopped`
/// every parked request is answered -32001. Batch members are answered at once, as before.
extension Bus {
    /// Parks a request refused because its plugin is not running, when that plugin waits
    /// (`starting`, `backoff`) and its queue has room; false: answer the refusal now.
    func parkForStart(
        _ peer: Peer, _ principal: Principal, _ line: UnsafeRawBufferPointer, method: String, idSpan: Range<Int>,
        answersSpan: Range<Int>?
    ) -> Bool {
        guard forwarder.currentBatch == nil else { return false }
        let dot = method.firstIndex(of: ".") ?? method.endIndex
        guard let slot = pluginSet.slots[String(method[..<dot])], StartWaitQueue<ParkedRequest>.waits(in: slot.life.state) else {
            return false
        }
        let deadline = forwarder.replayDeadlineMs ?? loop.nowMs + (slot.config.requestTimeoutMs ?? config.limits.requestTimeoutMs)
        let item = ParkedRequest(
            peer: peer, principal: principal, line: Array(line), method: method, idSpan: idSpan, answersSpan: answersSpan)
        guard
            slot.waiting.admit(
                item, bytes: line.count, deadlineMs: deadline, maxCount: config.limits.maxStartWaiters,
                maxBytes: config.limits.maxStartWaitBytes)
        else { return false }
        armStartWaitTimer(slot)
        return true
    }

    func armStartWaitTimer(_ slot: PluginSlot) {
        guard let next = slot.waiting.nextDeadlineMs else {
            slot.waitTimer?.stop()
            return
        }
        let timer =
            slot.waitTimer
            ?? Timer(loop: loop) { [weak self, weak slot] in
                if let self, let slot { self.expireStartWaiters(slot) }
            }
        slot.waitTimer = timer
        let now = loop.nowMs
        timer.start(after: next > now ? next - now : 0)
    }

    /// Answers -32002 to the parked requests whose deadline passed.
    func expireStartWaiters(_ slot: PluginSlot) {
        for p in slot.waiting.expire(nowMs: loop.nowMs) where !p.peer.closed {
            counters.timeouts += 1
            answerParked(
                p,
                RPCError(
                    .timeout, "plugin \(slot.config.name) did not start within the request's deadline",
                    data: ["plugin": .string(slot.config.name), "state": .string(slot.life.state.rawValue)]))
        }
        armStartWaitTimer(slot)
    }

    /// The plugin's state changed: it runs (handle the parked requests again, on the next loop
    /// turn, after its welcome), or it will not (answer them -32001).
    func startWaitersChanged(_ slot: PluginSlot) {
        guard !slot.waiting.isEmpty else { return }
        switch slot.life.state {
        case .running:
            loop.after(ms: 0) { [weak self, weak slot] in
                if let self, let slot { self.replayStartWaiters(slot) }
            }
        case .failed, .stopped:
            let error = slot.unavailableError()
            for e in slot.waiting.drain() where !e.item.peer.closed { answerParked(e.item, error) }
            armStartWaitTimer(slot)
        case .starting, .backoff:
            break
        }
    }

    func replayStartWaiters(_ slot: PluginSlot) {
        for e in slot.waiting.drain() where !e.item.peer.closed {
            let p = e.item
            forwarder.replayDeadlineMs = e.deadlineMs
            defer { forwarder.replayDeadlineMs = nil }
            p.line.withUnsafeBytes { buf in
                guard let msg = try? tokener.parse(buf) else { return }
                handleRequest(
                    p.peer, p.principal, msg, buf, method: p.method, id: msg.member("id"), idSpan: p.idSpan, answersSpan: p.answersSpan)
            }
            enforceOutputBounds(p.peer)
        }
        armStartWaitTimer(slot)
    }

    private func answerParked(_ p: ParkedRequest, _ e: RPCError) {
        let idText = p.line.withUnsafeBytes { String(decoding: UnsafeRawBufferPointer(rebasing: $0[p.idSpan]), as: UTF8.self) }
        sendError(p.peer.conn, idText: idText, e)
        enforceOutputBounds(p.peer)
    }
}
