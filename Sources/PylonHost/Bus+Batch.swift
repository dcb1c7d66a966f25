import CJSONC
import PylonCore
import PylonProtocol

/// The one line a JSON-RPC batch is answered with, `[entry,entry,…]`, built as its members are
/// answered, within `limit` bytes (`maxLineBytes`, the line limit of the host's own input).
/// Room is kept for an error entry (`entryReserve`) of every member not answered yet, so a
/// member's reply goes in only if it fits with that room kept; one that does not fit is answered
/// with a small `-32006` entry instead (`Bus.batchEntry`). Errors always go in.
///
/// No I/O. Unit-tested in BatchLineTests.
struct BatchLine {
    let limit: Int
    /// Room kept per member not answered yet: an error entry with an id of up to 40 bytes.
    static let entryReserve = 256
    /// `[` and the entries so far, joined by commas.
    private(set) var bytes: [UInt8] = [UInt8(ascii: "[")]
    private(set) var entries = 0
    /// Members that may still add an entry.
    private(set) var unanswered: Int

    init(limit: Int, members: Int) {
        self.limit = limit
        unanswered = members
    }

    /// Whether an entry of `n` bytes fits, with room kept for the other unanswered members.
    func fits(_ n: Int) -> Bool {
        bytes.count + 1 + n + 1 + max(0, unanswered - 1) * Self.entryReserve <= limit
    }

    /// One member's entry (a compact JSON object).
    mutating func add(_ entry: UnsafeRawBufferPointer) {
        if entries > 0 { bytes.append(UInt8(ascii: ",")) }
        bytes.append(contentsOf: entry)
        entries += 1
        unanswered = max(0, unanswered - 1)
    }

    /// A member that takes no entry (a notification, a response): its room is given back.
    mutating func noEntry() { unanswered = max(0, unanswered - 1) }

    var isEmpty: Bool { entries == 0 }

    /// The array, closed.
    var line: [UInt8] { bytes + [UInt8(ascii: "]")] }
}

/// The replies to one JSON-RPC batch (JSON-RPC 2.0 §6): one entry per member that is a request,
/// filled in any order, sent as one array once every entry is in. Members that are notifications
/// (or responses) take no entry; a batch without a request gets no reply at all.
final class BatchReply {
    /// Held strongly, as a lone request's `Pending.Origin.peer` holds its peer: a member's
    /// reply can come after the client closed (and left `Bus.peers`).
    let peer: Peer
    private(set) var reply: BatchLine
    /// Forwarded members whose replies have not come yet.
    var outstanding = 0
    /// Set once every member has been handled (only then can the batch be complete).
    var sealed = false
    /// A target a member could not wait for (see `Bus.deferIfCongested`): the batch's further
    /// members wait (its peer's input is held) until it drains.
    var congested: Peer?

    init(peer: Peer, limit: Int, members: Int) {
        self.peer = peer
        reply = BatchLine(limit: limit, members: members)
    }

    var isComplete: Bool { sealed && outstanding == 0 }

    /// Adds a member's entry. `id`: the member's id as JSON text when the entry is a reply that
    /// may be refused for its size (a result, or a plugin's answer); such an entry that does not
    /// fit is answered with a `-32006` entry for that id instead. Nothing is kept for a peer
    /// that has gone.
    func add(_ entry: UnsafeRawBufferPointer, id: String? = nil) {
        guard !peer.closed else { return reply.noEntry() }
        if let id, !reply.fits(entry.count) { return addTooLarge(entry.count, id: id) }
        let before = reply.bytes.count
        reply.add(entry)
        peer.batchBytes += reply.bytes.count - before
    }

    /// A result whose text is already built (`ReportCache`): the envelope is written only if it
    /// fits.
    func addResult(_ result: [UInt8], id: String) {
        guard !peer.closed else { return reply.noEntry() }
        var id = id
        let n = 33 + id.utf8.count + result.count  // {"jsonrpc":"2.0","id":…,"result":…}
        if !reply.fits(n) { return addTooLarge(n, id: id) }
        id.withUTF8 { idText in
            result.withUnsafeBytes { Envelope.result(id: .text(UnsafeRawBufferPointer(idText)), .text($0)).withUnsafeBytes { add($0) } }
        }
    }

    /// The `-32006` entry of a member whose reply of `n` bytes does not fit.
    private func addTooLarge(_ n: Int, id: String) {
        var id = id
        let before = reply.bytes.count
        let e = Bus.batchEntryTooLarge(n, limit: reply.limit)
        id.withUTF8 { Envelope.error(id: .text(UnsafeRawBufferPointer($0)), e).withUnsafeBytes { reply.add($0) } }
        peer.batchBytes += reply.bytes.count - before
    }

    func noEntry() { reply.noEntry() }

    /// The batch was sent (or its peer is gone): its bytes are no longer held for the peer.
    func release() -> [UInt8] {
        peer.batchBytes -= reply.bytes.count
        let line = reply.line
        reply = BatchLine(limit: reply.limit, members: 0)
        return line
    }
}

/// Where a batch line's handling stands between loop turns (`Peer.batchInProgress`).
struct BatchCursor {
    let reply: BatchReply
    /// Where the next member starts in the line (the line comes again whole: `Connection`'s
    /// `deferCurrentLine`).
    var resumeAt: Int
    /// The line's `[`.
    let arrayStart: Int
    /// The line's length: the line that comes again is this one.
    let lineBytes: Int
}

extension Bus {
    /// A line holding a JSON array: a batch. Each member is handled exactly as if it had come
    /// alone on a line of its own (the same parse, routing, permissions, consent and limits) and
    /// costs what it would cost alone: one unit of the connection's turn budget (more for a
    /// report), so a batch's members are handled over as many loop turns as lines would be, and
    /// only while the connection's output is within its bound. Only where its reply goes
    /// differs. An empty array, or one of more than `limits.maxBatchMembers`, gets one `-32600`.
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
        counters.batches += 1
        let batch = BatchReply(peer: peer, limit: config.limits.maxLineBytes, members: count)
        continueBatch(peer, line, BatchCursor(reply: batch, resumeAt: start + 1, arrayStart: start, lineBytes: line.count))
    }

    /// Handles the batch's members from `cursor` on while the connection's turn allows
    /// (`Connection.mayContinueLine`); then keeps the place and has the line come again on a
    /// later turn, or seals the batch after its last member.
    func continueBatch(_ peer: Peer, _ line: UnsafeRawBufferPointer, _ cursor: BatchCursor) {
        let batch = cursor.reply
        peer.batchInProgress = nil
        forwarder.currentBatch = batch
        defer { forwarder.currentBatch = nil }
        var members = RawJSON.ElementCursor(line, cursor.arrayStart..<line.count)
        members.resume(at: cursor.resumeAt)
        var first = true
        while let at = members.nextElement() {
            if !first {
                guard peer.conn.mayContinueLine, takeUidWork(peer, 1) else {
                    var next = cursor
                    next.resumeAt = at
                    peer.batchInProgress = next
                    peer.conn.deferCurrentLine()
                    return
                }
                peer.conn.charge(1)
            }
            first = false
            let member = UnsafeRawBufferPointer(rebasing: line[members.skipValue()])
            let entries = batch.reply.entries
            let outstanding = batch.outstanding
            if member.first == UInt8(ascii: "{") {
                handleLine(peer, member)
            } else {
                counters.protocolErrors += 1
                sendError(peer.conn, id: nil, RPCError(.invalidRequest, "a batch member must be a JSON object"))
            }
            if peer.closed { return }
            if batch.reply.entries == entries && batch.outstanding == outstanding { batch.noEntry() }
            if let target = batch.congested {
                // The member went; the ones after it wait until the target drains.
                batch.congested = nil
                peer.conn.hold(until: target.conn)
                counters.heldForCongestion += 1
            }
            guard enforceOutputBounds(peer) else { return }
        }
        batch.sealed = true
        finishBatch(batch)
    }

    /// The reply text of one member, taken into the batch under way when it is for that batch's
    /// peer; false when no batch is collecting for `conn` (the caller sends it as a line).
    /// `id`: the member's id as JSON text, for a reply that may be too large for the batch.
    func takeIntoBatch(_ conn: Connection, _ reply: [UInt8], id: String? = nil) -> Bool {
        guard let b = forwarder.currentBatch, b.peer.conn === conn else { return false }
        reply.withUnsafeBytes { b.add($0, id: id) }
        return true
    }

    /// A forwarded member's reply (or its error), with the member's own id restored.
    func batchMemberAnswered(_ b: BatchReply, _ reply: UnsafeRawBufferPointer, id: String? = nil) {
        b.outstanding -= 1
        b.peer.inflight -= 1
        b.add(reply, id: id)
        if !b.peer.closed, enforceOutputBounds(b.peer) { finishBatch(b) }
    }

    /// A plugin's answer to a batch member, with the member's own id spliced back in.
    func relayToBatch(_ line: UnsafeRawBufferPointer, idSpan: Range<Int>, _ b: BatchReply, originalId: String) {
        var reply = [UInt8]()
        reply.reserveCapacity(line.count - idSpan.count + originalId.utf8.count)
        reply.append(contentsOf: UnsafeRawBufferPointer(rebasing: line[..<idSpan.lowerBound]))
        reply.append(contentsOf: originalId.utf8)
        reply.append(contentsOf: UnsafeRawBufferPointer(rebasing: line[idSpan.upperBound...]))
        reply.withUnsafeBytes { batchMemberAnswered(b, $0, id: originalId) }
    }

    /// Sends the batch's array once every member is answered (nothing for a batch of
    /// notifications).
    func finishBatch(_ b: BatchReply) {
        guard b.isComplete else { return }
        let empty = b.reply.isEmpty
        let line = b.release()
        guard !b.peer.closed else { return }
        if !empty {
            line.withUnsafeBytes { b.peer.conn.sendLine($0) }
            guard enforceOutputBounds(b.peer) else { return }
        }
        if b.peer.conn.peerShutdown { closeIfDone(b.peer) }
    }

    /// The entry of a member whose reply would not fit in the batch's line.
    static func batchEntryTooLarge(_ n: Int, limit: Int) -> RPCError {
        RPCError(
            .messageTooLarge, "a reply of \(n) bytes does not fit in this batch's reply (maxLineBytes \(limit)); send it alone",
            data: ["limit": "maxLineBytes", "value": .int(Int64(limit)), "reply": .int(Int64(n))])
    }
}
