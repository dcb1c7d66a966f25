import CJSONC
import PylonCore
import PylonProtocol

/// The replies to one JSON-RPC batch (JSON-RPC 2.0 §6): one slot per member that is a request,
/// filled in any order, sent as one array once every slot is filled. Members that are
/// notifications (or responses) take no slot; a batch without a request gets no reply at all.
final class BatchReply {
    /// Held strongly, as a lone request's `Pending.Origin.peer` holds its peer: a member's
    /// reply can come after the client closed (and left `Bus.peers`).
    let peer: Peer
    /// The replies so far, each one compact JSON object.
    private(set) var parts: [[UInt8]] = []
    private(set) var bytes = 0
    /// Forwarded members whose replies have not come yet.
    var outstanding = 0
    /// Set once every member has been handled (only then can the batch be complete).
    var sealed = false
    /// A target a member could not wait for (see `Bus.deferIfCongested`): the peer's input is
    /// held until it drains once the batch has been dispatched.
    var congested: Peer?

    init(peer: Peer) { self.peer = peer }

    func add(_ reply: UnsafeRawBufferPointer) {
        parts.append(Array(reply))
        bytes += reply.count
    }

    var isComplete: Bool { sealed && outstanding == 0 }

    /// `[r1,r2,…]`: the one line the batch is answered with.
    var line: [UInt8] {
        var out = [UInt8]()
        out.reserveCapacity(bytes + parts.count + 1)
        out.append(UInt8(ascii: "["))
        for (i, p) in parts.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: p)
        }
        out.append(UInt8(ascii: "]"))
        return out
    }
}

extension Bus {
    /// A line holding a JSON array: a batch. Each member is handled exactly as if it had come
    /// alone on a line of its own (the same parse, routing, permissions, consent and limits);
    /// only where its reply goes differs. An empty array, or one of more than
    /// `limits.maxBatchMembers`, gets one `-32600`.
    func handleBatch(_ peer: Peer, _ line: UnsafeRawBufferPointer, count: Int) {
        let limit = config.limits.maxBatchMembers
        guard count > 0 else {
            counters.protocolErrors += 1
            sendError(peer.conn, id: nil, RPCError(.invalidRequest, "an empty batch is not a request"))
            return
        }
        guard count <= limit else {
            counters.protocolErrors += 1
            sendError(
                peer.conn, id: nil,
                RPCError(
                    .invalidRequest, "a batch of \(count) messages exceeds the limit of \(limit); send fewer at once",
                    data: ["limit": "maxBatchMembers", "value": .int(Int64(limit)), "received": .int(Int64(count))]))
            return
        }
        let start = RawJSON.skipSpace(line, 0)
        let batch = BatchReply(peer: peer)
        counters.batches += 1
        currentBatch = batch
        for span in RawJSON.Elements(line, start..<line.count) {
            let member = UnsafeRawBufferPointer(rebasing: line[span])
            if member.first == UInt8(ascii: "{") {
                handleLine(peer, member)
            } else {
                counters.protocolErrors += 1
                sendError(peer.conn, id: nil, RPCError(.invalidRequest, "a batch member must be a JSON object"))
            }
            if peer.closed { break }
        }
        currentBatch = nil
        batch.sealed = true
        if let target = batch.congested, !peer.closed {
            peer.conn.hold(until: target.conn)
            counters.heldForCongestion += 1
        }
        finishBatch(batch)
    }

    /// The reply text of one member, taken into the batch under way when it is for that batch's
    /// peer; false when no batch is collecting for `conn` (the caller sends it as a line).
    func takeIntoBatch(_ conn: Connection, _ reply: [UInt8]) -> Bool {
        guard let b = currentBatch, b.peer.conn === conn else { return false }
        reply.withUnsafeBytes { b.add($0) }
        return true
    }

    /// A forwarded member's reply (or its error), with the member's own id restored.
    func batchMemberAnswered(_ b: BatchReply, _ reply: UnsafeRawBufferPointer) {
        b.outstanding -= 1
        b.peer.inflight -= 1
        b.add(reply)
        finishBatch(b)
    }

    /// A plugin's answer to a batch member, with the member's own id spliced back in.
    func relayToBatch(_ line: UnsafeRawBufferPointer, idSpan: Range<Int>, _ b: BatchReply, originalId: String) {
        var reply = [UInt8]()
        reply.reserveCapacity(line.count - idSpan.count + originalId.utf8.count)
        reply.append(contentsOf: UnsafeRawBufferPointer(rebasing: line[..<idSpan.lowerBound]))
        reply.append(contentsOf: originalId.utf8)
        reply.append(contentsOf: UnsafeRawBufferPointer(rebasing: line[idSpan.upperBound...]))
        reply.withUnsafeBytes { batchMemberAnswered(b, $0) }
    }

    /// Sends the batch's array once every member is answered (nothing for a batch of
    /// notifications).
    func finishBatch(_ b: BatchReply) {
        guard b.isComplete, !b.peer.closed else { return }
        if !b.parts.isEmpty { b.line.withUnsafeBytes { b.peer.conn.sendLine($0) } }
        if b.peer.conn.peerShutdown { closeIfDone(b.peer) }
    }
}
