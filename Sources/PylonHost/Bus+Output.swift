import CJSONC
import PylonCore
import PylonProtocol

/// Replies and errors written to a peer (or taken into the batch being handled), and the
/// best-effort readers of an oversized line's first bytes.
extension Bus {
    /// Sends one reply line, or takes it into the batch being handled for `conn`'s peer. `id`:
    /// the request's id as JSON text, for a result that may be too large for the batch's line.
    func sendReply(_ conn: Connection, _ envelope: [UInt8], id: String? = nil) {
        if forwarder.currentBatch != nil, takeIntoBatch(conn, envelope, id: id) { return }
        conn.send(envelope: envelope)
    }

    /// A result whose text is already built (`ReportCache`), for an id kept as JSON text.
    func sendResult(_ conn: Connection, idText: String, text result: [UInt8]) {
        if let b = forwarder.currentBatch, b.peer.conn === conn { return b.addResult(result, id: idText) }
        var idText = idText
        idText.withUTF8 { id in
            result.withUnsafeBytes { conn.send(envelope: Envelope.result(id: .text(UnsafeRawBufferPointer(id)), .text($0))) }
        }
    }

    /// Bytes a client may hold (queued to it, or in its open batches) before its uid's total is
    /// looked at: a client that reads its replies holds less nearly always, so the common reply
    /// costs no sum over the uid's connections.
    static let uidCheckAboveBytes = 65_536

    /// The output bounds of a client, after something was queued for it or gathered in its
    /// batch: past `closeAboveQueuedBytes` it is disconnected; past its uid's
    /// `maxQueuedBytesPerUid` the uid's connections holding the most are disconnected until the
    /// uid is back within it (`Admission.evictions`: its connections that read hold next to
    /// nothing and stay). Returns false when `peer` itself was disconnected.
    @discardableResult
    func enforceOutputBounds(_ peer: Peer) -> Bool {
        guard peer.heldBytes > Bus.uidCheckAboveBytes, !peer.isPlugin, !peer.closed else { return !peer.closed }
        let limits = config.limits
        if peer.heldBytes > max(limits.closeAboveQueuedBytes, limits.maxQueuedBytes) {
            disconnectSlowReader(peer, limit: "closeAboveQueuedBytes")
            return false
        }
        guard let uid = peer.credentials?.uid else { return true }
        for p in peerTable.admission.evictions(ofUid: uid, limit: limits.maxQueuedBytesPerUid, held: { $0.heldBytes }) where !p.closed {
            disconnectSlowReader(p, limit: "maxQueuedBytesPerUid")
        }
        return !peer.closed
    }

    /// Disconnects a client that does not read its replies (`slow_readers_closed`).
    func disconnectSlowReader(_ peer: Peer, limit: String) {
        counters.slowReadersClosed += 1
        log.warn("client disconnected: it does not read its replies", ["peer": peer.label, "queued_bytes": peer.heldBytes, "limit": limit])
        peer.conn.close()
        peerClosed(peer)
        releaseFreeMemorySoon()
    }

    func sendResult(_ conn: Connection, id: OpaquePointer?, _ result: JSON) {
        sendReply(conn, Envelope.result(id: .ref(id), .value(result)))
    }

    func sendError(_ conn: Connection, id: OpaquePointer?, _ e: RPCError) {
        sendReply(conn, Envelope.error(id: .ref(id), e))
    }

    /// An error response for an id kept as JSON text (the caller's own bytes).
    func sendError(_ conn: Connection, idText: String, _ e: RPCError) {
        var idText = idText
        idText.withUTF8 { sendReply(conn, Envelope.error(id: .text(UnsafeRawBufferPointer($0)), e)) }
    }

    /// A result for an id kept as JSON text (the caller's own bytes).
    func sendResult(_ conn: Connection, idText: String, _ result: JSON) {
        var idText = idText
        let id = idText
        idText.withUTF8 { sendReply(conn, Envelope.result(id: .text(UnsafeRawBufferPointer($0)), .value(result)), id: id) }
    }

    func sendError(_ conn: Connection, jsonId id: JSON?, _ e: RPCError) {
        sendReply(conn, Envelope.error(id: id.map { .value($0) } ?? .null, e))
    }

    /// Best effort: whether the first bytes of a too-long line are those of a response (a
    /// `result` or `error` member and no `method` among them).
    static func looksLikeResponse(_ head: [UInt8]) -> Bool {
        let s = String(decoding: head, as: UTF8.self)
        return (s.contains("\"result\"") || s.contains("\"error\"")) && !s.contains("\"method\"")
    }

    /// Best effort: the `id` of a message whose line was too long, from its first bytes.
    static func scanId(_ head: [UInt8]) -> JSON? {
        let s = String(decoding: head, as: UTF8.self)
        guard let r = s.range(of: "\"id\"") else { return nil }
        var rest = s[r.upperBound...].drop { $0 == " " || $0 == "\t" }
        guard rest.first == ":" else { return nil }
        rest = rest.dropFirst().drop { $0 == " " || $0 == "\t" }
        if rest.first == "\"" {
            let body = rest.dropFirst()
            guard let end = body.firstIndex(of: "\""), !body[..<end].contains("\\") else { return nil }
            return .string(String(body[..<end]))
        }
        let digits = rest.prefix { $0 == "-" || ($0 >= "0" && $0 <= "9") }
        if let i = Int64(digits) { return .int(i) }
        return nil
    }
}
