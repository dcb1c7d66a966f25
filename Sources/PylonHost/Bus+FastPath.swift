import CJSONC
import PylonCore

/// The two hot paths without a json-c tree: a request routed to a plugin (or a `bus.provide`
/// provider), and a plugin's answer to a routed request. `RawJSON.scanMessage` validates the line
/// and finds its members in one pass; the line is then forwarded with its id spliced, as in the
/// full path.
///
/// Anything else — host methods, notifications, the handshake, an error to report, a consent
/// refusal, a line the scanner is not sure about — returns false, and `handleLine` handles the
/// message from scratch with json-c, so replies, errors and counters are exactly those of the
/// full path.
extension Bus {
    /// `m`: the line's members, from `RawJSON.classifyMessage` (run by `handleLine` with one
    /// level of depth margin, so that json-c, not the scanner, words the depth error).
    func fastRoute(_ peer: Peer, _ line: UnsafeRawBufferPointer, _ m: MessageSpans) -> Bool {
        guard let v = m.jsonrpc, RawJSON.equals(line, v.lowerBound, v.upperBound, "\"2.0\""),
              let idSpan = m.id
        else { return false }
        if let methodSpan = m.method {
            return fastRequest(peer, line, m, idSpan: idSpan, methodSpan: methodSpan)
        }
        guard m.result != nil || m.error != nil else { return false }
        return fastResponse(peer, line, idSpan: idSpan)
    }

    private func fastRequest(_ peer: Peer, _ line: UnsafeRawBufferPointer, _ m: MessageSpans, idSpan: Range<Int>,
                             methodSpan: Range<Int>) -> Bool {
        // A string or number id (null ids and the rest take the full path).
        let first = line[idSpan.lowerBound]
        guard first == UInt8(ascii: "\"") || first == UInt8(ascii: "-") || (first >= 0x30 && first <= 0x39) else { return false }
        if let p = m.params {
            let c = line[p.lowerBound]
            guard c == UInt8(ascii: "{") || c == UInt8(ascii: "[") else { return false }
        }
        guard let method = RawJSON.plainString(line, methodSpan),
              peer.slot == nil || peer.handshaken, !shuttingDown,
              !method.hasPrefix("bus."), !method.hasPrefix("consent."),
              peer.isPlugin || isPermitted(method, peer.credentials),
              peer.inflight < config.limits.maxInflightPerConnection
        else { return false }
        if let provider = provided[method] {
            forward(peer, nil, line, id: nil, idSpan: idSpan, to: provider, timeoutMs: config.limits.requestTimeoutMs)
            fastRouted += 1
            return true
        }
        let dot = method.firstIndex(of: ".") ?? method.endIndex
        guard let slot = slots[String(method[..<dot])], slot.life.state == .running, let target = slot.peer,
              target.handshaken
        else { return false }
        if let manifest = slot.manifest, !manifest.methods.isEmpty {
            guard let spec = manifest.methods[method] else { return false }
            if spec.consent != nil {
                guard consent.masterGranted else { return false }
                var unsure = false
                let key = spec.consentKey { name in
                    // Absent params, or an array: no such field (as json-c's lookup says).
                    guard let p = m.params, line[p.lowerBound] == UInt8(ascii: "{") else { return nil }
                    let params = UnsafeRawBufferPointer(rebasing: line[p])
                    // A key written with escapes could spell the field: let json-c decide.
                    if params.contains(UInt8(ascii: "\\")) { unsure = true; return nil }
                    guard let span = RawJSON.memberValueSpan(params, key: name) else { return nil }
                    guard params[span.lowerBound] == UInt8(ascii: "\"") else { return nil }  // not a string: absent
                    guard let s = RawJSON.plainString(params, span) else { unsure = true; return nil }
                    return s
                }
                if unsure { return false }
                if case .key(let k) = key, !consent.isGranted(k) { return false }
            }
        }
        forward(peer, nil, line, id: nil, idSpan: idSpan, to: target,
                timeoutMs: slot.config.requestTimeoutMs ?? config.limits.requestTimeoutMs)
        fastRouted += 1
        return true
    }

    private func fastResponse(_ peer: Peer, _ line: UnsafeRawBufferPointer, idSpan: Range<Int>) -> Bool {
        guard let hostId = RawJSON.plainInt(line, idSpan), let p = pending[hostId], p.target === peer,
              case .peer(let origin, let originalId) = p.origin
        else { return false }
        pending[hostId] = nil
        peer.slot?.served += 1
        relayResponse(line, idSpan: idSpan, to: origin, originalId: originalId)
        fastRouted += 1
        return true
    }

    /// Sends a plugin's answer to the client (or plugin) that asked, with the caller's own id
    /// spliced back in.
    func relayResponse(_ line: UnsafeRawBufferPointer, idSpan: Range<Int>, to origin: Peer, originalId: String) {
        origin.inflight -= 1
        guard !origin.closed else { return }
        var idText = originalId
        idText.withUTF8 { origin.conn.sendSpliced(line, idSpan, UnsafeRawBufferPointer($0)) }
        if origin.conn.peerShutdown { closeIfDone(origin) }
    }
}
