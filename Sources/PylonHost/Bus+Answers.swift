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
/// carrying `_answers` is routed and judged as any other call of that plugin.
struct PendingAnswers {
    var ids: [Int64]
    /// The result's JSON text, as the plugin wrote it (validated with the whole line).
    var result: [UInt8]
}

extension Bus {
    /// Reads and checks `_answers` (its value at `span` of `line`) of a request from `peer`:
    /// `{"ids": [host-issued ids], "result": value}`, only from a plugin, each id a request
    /// forwarded to that plugin, unanswered (no more ids than it serves).
    func readAnswers(_ peer: Peer, _ line: UnsafeRawBufferPointer, _ span: Range<Int>) -> Result<PendingAnswers, RPCError> {
        guard peer.isPlugin else {
            return .failure(RPCError(.invalidRequest, "\"_answers\" is for plugins: requests they serve, answered when this call succeeds"))
        }
        let v = UnsafeRawBufferPointer(rebasing: line[span])
        guard v.first == UInt8(ascii: "{"), let idsSpan = RawJSON.memberValueSpan(v, key: "ids"),
            let ids = RawJSON.intArray(v, idsSpan), !ids.isEmpty, let r = RawJSON.memberValueSpan(v, key: "result")
        else {
            return .failure(
                RPCError(.invalidRequest, "\"_answers\" must be {\"ids\": [integer request ids, at least one], \"result\": any value}"))
        }
        guard ids.count <= pending.count(targeting: peer.id) else {
            return .failure(RPCError(.notPermitted, "\"_answers\" names more requests than \(peer.label) is serving"))
        }
        for id in ids {
            guard let p = pending[id], p.target === peer, !p.isHostCall else {
                return .failure(
                    RPCError(.notPermitted, "\"_answers\": \(id) is not a request \(peer.label) is serving (answered or timed out)"))
            }
        }
        return .success(PendingAnswers(ids: ids, result: Array(v[r])))
    }

    /// The call that carried `answers` succeeded: answers each request still pending at `plugin`
    /// with `answers.result`, as the plugin's own reply would have (its caller's id restored).
    func answerOnSuccess(_ answers: PendingAnswers, plugin: Peer) {
        var line = Array(#"{"jsonrpc":"2.0","id":"#.utf8)
        let idStart = line.count
        for id in answers.ids {
            guard let p = takePending(id, answeredBy: plugin, if: { !$0.isHostCall }) else { continue }
            line.removeSubrange(idStart...)
            JSONText.appendDecimal(id, to: &line)
            let idSpan = idStart..<line.count
            line.append(contentsOf: #","result":"#.utf8)
            line.append(contentsOf: answers.result)
            line.append(UInt8(ascii: "}"))
            counters.answeredOnSuccess += 1
            line.withUnsafeBytes { l in
                if !monitors.isEmpty, let t = monitorTraces.removeValue(forKey: id) { monitorReply(p, t, l) }
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
        guard !pendingAnswers.isEmpty, let a = pendingAnswers.removeValue(forKey: hostId), succeeded else { return }
        answerOnSuccess(a, plugin: plugin)
    }
}
