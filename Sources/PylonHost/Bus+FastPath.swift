import CJSONC
import PylonCore
import PylonProtocol

/// The two hot paths without a json-c tree: a request routed to a plugin (or a `bus.provide`
/// provider), and a plugin's answer to a routed request. `RawJSON.classifyMessage` validates the line
/// and finds its members in one pass; the line is then forwarded with its id spliced, as in the
/// full path.
///
/// Anything else — host methods, notifications, the handshake, an error to report, a consent
/// refusal — returns false, and `handleLine` hands the message to the full path (a json-c tree
/// of the line the scan accepted), so replies, errors and counters are exactly those of the
/// full path.
extension Bus {
    /// `m`: the line's members, from `RawJSON.classifyMessage` (keys decoded; no routing member
    /// repeated, no key holding U+0000: such lines were refused before).
    func fastRoute(_ peer: Peer, _ line: UnsafeRawBufferPointer, _ m: MessageSpans) -> Bool {
        guard let v = m.jsonrpc, RawJSON.equals(line, v.lowerBound, v.upperBound, "\"2.0\""),
            let idSpan = m.id
        else { return false }
        if let methodSpan = m.method {
            return fastRequest(peer, line, m, idSpan: idSpan, methodSpan: methodSpan)
        }
        guard m.result != nil || m.error != nil else { return false }
        return fastResponse(peer, line, idSpan: idSpan, succeeded: m.error == nil)
    }

    private func fastRequest(
        _ peer: Peer, _ line: UnsafeRawBufferPointer, _ m: MessageSpans, idSpan: Range<Int>,
        methodSpan: Range<Int>
    ) -> Bool {
        // A string or number id (null ids and the rest take the full path).
        let first = line[idSpan.lowerBound]
        guard first == UInt8(ascii: "\"") || first == UInt8(ascii: "-") || (first >= 0x30 && first <= 0x39) else { return false }
        if let p = m.params {
            let c = line[p.lowerBound]
            guard c == UInt8(ascii: "{") || c == UInt8(ascii: "[") else { return false }
        }
        // `_pylon` from a sender is refused, and method names are checked, on the full path.
        guard m.pylon == nil, let method = RawJSON.plainString(line, methodSpan), peer.slot == nil || peer.handshaken,
            peer.inflight < config.limits.maxInflightPerConnection, InboundEnvelope.isValidMethodName(method)
        else { return false }
        var via: Int64?
        if let v = m.onBehalfOf {
            guard let n = RawJSON.plainInt(line, v) else { return false }
            via = n
        }
        guard let principal = principal(of: peer, via: via) else { return false }
        var answers: Envelope.Answers?
        if let a = m.answers {
            guard case .success(let read) = readAnswers(peer, line, a) else { return false }  // reported by the full path
            answers = read
        }
        // Consent-template fields read from the params bytes, keys and strings decoded (the
        // reader of docs/PROTOCOL.md "Canonical form": the value json-c gives the plugin). Absent
        // params, or an array: no such field (as json-c's lookup says).
        let params = m.params.map { UnsafeRawBufferPointer(rebasing: line[$0]) }
        // The same decision as the full path; anything but "forward" is answered there. (The
        // closure is passed directly so that it stays non-escaping: no allocation per request.)
        let decision = route(peer, principal, method) { name in
            guard let params else { return nil }
            var name = name
            let span = name.withUTF8 { RawJSON.member(params, 0..<params.count, named: UnsafeRawBufferPointer($0)) }
            return span.flatMap { RawJSON.stringValue(params, $0) }  // absent, or not a string: nil
        }
        guard case .forward(let target, let timeoutMs, _) = decision, !takesParamCheck(target, method) else { return false }
        forward(peer, principal, line, idSpan: idSpan, to: target, timeoutMs: timeoutMs, method: method, answers: answers)
        counters.fastRouted += 1
        return true
    }

    private func fastResponse(_ peer: Peer, _ line: UnsafeRawBufferPointer, idSpan: Range<Int>, succeeded: Bool) -> Bool {
        // Answers to the host's own requests take the full path.
        guard let hostId = RawJSON.plainInt(line, idSpan),
            let p = takePending(
                hostId, answeredBy: peer,
                if: {
                    if case .peer = $0.origin { return true }
                    return false
                }),
            case .peer(let origin, let originalId) = p.origin
        else { return false }
        if !monitoring.monitors.isEmpty, let t = monitoring.traces.removeValue(forKey: hostId) { monitorReply(p, t, line) }
        settleAnswers(hostId, succeeded: succeeded, plugin: origin)
        relayResponse(line, idSpan: idSpan, to: origin, originalId: originalId)
        counters.fastRouted += 1
        return true
    }

    /// Sends a plugin's answer to the client (or plugin) that asked, with the caller's own id
    /// spliced back in.
    func relayResponse(_ line: UnsafeRawBufferPointer, idSpan: Range<Int>, to origin: Peer, originalId: String) {
        origin.inflight -= 1
        guard !origin.closed else { return }
        // A client that does not read is not dispatched past `maxQueuedBytes`, but the answers to
        // what it had in flight still come (a provider's may be far larger than the question):
        // past `closeAboveQueuedBytes` it is disconnected rather than held in memory. Its uid's
        // connections together are bounded after the answer is queued (`enforceOutputBounds`).
        // Only looked at for a connection that already has a lot queued: no cost per reply.
        if !origin.isPlugin, origin.heldBytes + line.count > config.limits.maxQueuedBytes,
            origin.heldBytes + line.count > max(config.limits.closeAboveQueuedBytes, config.limits.maxQueuedBytes)
        {
            return disconnectSlowReader(origin, limit: "closeAboveQueuedBytes")
        }
        var idText = originalId
        idText.withUTF8 { origin.conn.sendSpliced(line, idSpan, UnsafeRawBufferPointer($0)) }
        guard enforceOutputBounds(origin) else { return }
        if origin.conn.peerShutdown { closeIfDone(origin) }
    }
}
