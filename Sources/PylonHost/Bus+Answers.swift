import PylonCore
import PylonProtocol

/// Answers on success (docs/PROTOCOL.md "Answers on success"): a plugin's request may name, in
/// `_answers`, requests forwarded to that plugin and still unanswered, with the result to answer
/// them with. When the request succeeds the host answers them itself, in the same loop turn as it
/// relays the success to the plugin: the plugin's own replies (a write, and a wake-up of the host
/// to read them) are saved. MA answers `ma.eventRecord` this way once `uploader.enqueue` has the
/// events (the device-rate cost is wake-ups: docs/BENCHMARKS.md).
///
/// Nothing new is allowed: a plugin may answer the requests it serves in any case, and the host
/// takes only those (the same check as a plugin's own reply, at the time of the answer); the call
/// carrying `_answers` is routed and judged as any other call of that plugin. What it names is
/// kept as the kit writes it (`Envelope.Answers`: the ids, and the result's text as the plugin
/// wrote it, validated with the whole line).
extension Bus {
    /// Reads and checks `_answers` (its value at `span` of `line`, as the line's scan found it)
    /// of a request from `peer`: `{"ids": [host-issued ids], "result": value}`, only from a
    /// plugin, each id a request forwarded to that plugin, unanswered (no more ids than it serves).
    func readAnswers(_ peer: Peer, _ line: UnsafeRawBufferPointer, _ span: Range<Int>?) -> Result<Envelope.Answers, RPCError> {
        guard peer.isPlugin else {
            return .failure(RPCError(.invalidRequest, "\"_answers\" is for plugins: requests they serve, answered when this call succeeds"))
        }
        guard let span else { return .failure(RPCError(.invalidRequest, "\"_answers\" could not be read")) }
        let v = UnsafeRawBufferPointer(rebasing: line[span])
        guard v.first == UInt8(ascii: "{"), let idsSpan = RawJSON.memberValueSpan(v, key: "ids"),
            let ids = RawJSON.intArray(v, idsSpan), !ids.isEmpty, let r = RawJSON.memberValueSpan(v, key: "result")
        else {
            return .failure(
                RPCError(.invalidRequest, "\"_answers\" must be {\"ids\": [integer request ids, at least one], \"result\": any value}"))
        }
        guard ids.count <= forwarder.pending.count(targeting: peer.id) else {
            return .failure(RPCError(.notPermitted, "\"_answers\" names more requests than \(peer.label) is serving"))
        }
        for id in ids {
            guard let p = forwarder.pending[id], p.target === peer, !p.isHostCall else {
                return .failure(
                    RPCError(.notPermitted, "\"_answers\": \(id) is not a request \(peer.label) is serving (answered or timed out)"))
            }
        }
        return .success(Envelope.Answers(ids: ids, result: Array(v[r])))
    }

    /// The call that carried `answers` succeeded: answers each request still pending at `plugin`
    /// with `answers.result`, as the plugin's own reply would have (its caller's id restored).
    func answerOnSuccess(_ answers: Envelope.Answers, plugin: Peer) {
        var line: [UInt8] = []
        for id in answers.ids {
            guard let p = takePending(id, answeredBy: plugin, if: { !$0.isHostCall }) else { continue }
            line.removeAll(keepingCapacity: true)
            answers.result.withUnsafeBytes { Envelope.appendResult(id: .int(id), .text($0), to: &line) }
            counters.answeredOnSuccess += 1
            line.withUnsafeBytes { l in
                guard let idSpan = RawJSON.memberValueSpan(l, key: "id") else { return }
                if !monitoring.monitors.isEmpty, let t = monitoring.traces.removeValue(forKey: id) { monitorReply(p, t, l) }
                switch p.origin {
                case .peer(let origin, let originalId): relayResponse(l, idSpan: idSpan, to: origin, originalId: originalId)
                case .batch(let b, let originalId): relayToBatch(l, idSpan: idSpan, b, originalId: originalId)
                case .host: break  // not taken (`isHostCall`)
                }
            }
        }
    }

    /// The answer `line` (to the host's request `hostId`) arrived: when that request carried
    /// `_answers` and the answer is a success (`succeeded`), they are answered now. Called
    /// before the answer is relayed to `plugin`.
    @inline(__always) func settleAnswers(_ hostId: Int64, succeeded: Bool, plugin: Peer) {
        guard !forwarder.pendingAnswers.isEmpty, let a = forwarder.pendingAnswers.removeValue(forKey: hostId), succeeded else { return }
        answerOnSuccess(a, plugin: plugin)
    }
}
