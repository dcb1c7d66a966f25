import CJSONC
import PylonCore
import PylonProtocol

/// Replies and errors written to a peer (or taken into the batch being handled), and the
/// best-effort readers of an oversized line's first bytes.
extension Bus {
    /// Sends one reply line, or takes it into the batch being handled for `conn`'s peer.
    func sendReply(_ conn: Connection, _ envelope: [UInt8]) {
        if currentBatch != nil, takeIntoBatch(conn, envelope) { return }
        conn.send(envelope: envelope)
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
        idText.withUTF8 { sendReply(conn, Envelope.result(id: .text(UnsafeRawBufferPointer($0)), .value(result))) }
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
