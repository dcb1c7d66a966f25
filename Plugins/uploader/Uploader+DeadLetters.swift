import PylonPluginKit

/// Dead letters: listed, re-queued and discarded by the stream's owner or an admin (a caller
/// that is neither gets -32005; without a stream, `deadLetters` lists only the caller's streams,
/// an admin's every stream). They count in the disk cap and the owner's share until re-queued or
/// discarded (docs/UPLOADER.md "uploader.deadLetters").
extension Uploader {
    /// `{stream?, limit?}`: the records set aside, oldest first.
    func deadLetters(_ call: Call) {
        let limit = Int(max(1, min(call.params["limit"]?.intValue ?? 100, 10_000)))
        let caller = Principal(caller: call.callerInfo)
        do {
            let names: [String]?
            if let s = call.params["stream"]?.stringValue {
                guard permit(call, s, "read the dead letters of") else { return }
                names = [s]
            } else if caller.isAdmin {
                names = nil
            } else {
                names = try store.deadLetterStreams().filter { mayUse($0, caller) }
            }
            let rows = try store.deadLetters(streams: names, limit: limit)
            call.reply([
                "deadLetters": .array(
                    rows.map { r in
                        [
                            "stream": .string(r[0].text ?? ""), "id": .string(r[1].text ?? ""),
                            "data": (try? JSON.parse(r[2].text ?? "null")) ?? .null, "batch": .string(r[3].text ?? ""),
                            "status": .int(r[4].int ?? 0), "reason": .string(r[5].text ?? ""), "atMs": .int(r[6].int ?? 0),
                        ]
                    })
            ])
        } catch {
            call.fail(RPCError(.internalError, "\(error)"))
        }
    }

    /// The `stream` (required) and `ids` (absent: every dead letter of the stream) of `requeue`
    /// and `discard`, checked in that order with the caller's right to the stream; nil after
    /// answering the refusal.
    private func deadLetterTarget(_ call: Call, _ action: String) -> (stream: String, ids: [String]?)? {
        guard let name = call.params["stream"]?.stringValue, Uploader.validStream(name) else {
            call.fail(RPCError(.invalidParams, "params.stream is required: 1-128 of [A-Za-z0-9._:-]"))
            return nil
        }
        guard permit(call, name, action) else { return nil }
        switch call.params["ids"] {
        case nil, .null?: return (name, nil)
        case .array(let list)? where !list.isEmpty && list.count <= limits.maxRecordsPerCall && list.allSatisfy({ $0.stringValue != nil }):
            return (name, list.compactMap(\.stringValue))
        default:
            call.fail(
                RPCError(
                    .invalidParams,
                    "params.ids must be an array of 1-\(limits.maxRecordsPerCall) record ids (or absent: every dead letter of the stream)"))
            return nil
        }
    }

    /// `{stream, ids?}`: queues dead letters again, at the end of the stream's queue, under its
    /// switch (which must be granted) and within the disk cap and the owner's share (net of the
    /// dead letters it removes). A dead letter whose id is already queued is removed (the queued
    /// record goes); one whose id or ts the enqueue refuses today stays set aside (`invalid`).
    func requeue(_ call: Call) {
        guard let target = deadLetterTarget(call, "re-queue the dead letters of") else { return }
        let name = target.stream
        var st = state(name)
        guard allows(st.consentKey) else {
            let sw = deniedSwitch(st.consentKey)
            call.fail(RPCError(.consentDenied, "consent switch \(sw) is denied", data: ["switch": .string(sw)]))
            return
        }
        commit()  // enqueues accepted before are ahead of the re-queued records, and counted
        var room = limits.maxDiskBytes - diskBytes
        if let o = st.owner { room = min(room, limits.diskBytes(for: o) - ledger.usage(o).bytes) }
        let plan: UploaderStore.Requeue
        do {
            let (p, done) = try store.requeue(
                stream: name, consent: st.consentKey, ids: target.ids, room: room, nowMs: System.wallClockMs())
            guard done else {
                let e =
                    st.owner.flatMap {
                        ledger.admit($0, bytes: p.addedBytes - p.removedBytes, newStream: false, totalBytes: diskBytes, limits: limits)
                    } ?? RPCError(.overloaded, "the re-queued records do not fit the disk cap", data: ["limit": "maxDiskBytes"])
                call.fail(e)
                return
            }
            plan = p
        } catch {
            call.fail(RPCError(.internalError, "could not re-queue the dead letters: \(error)"))
            return
        }
        st.committed(added: plan.requeued, bytes: plan.addedBytes, now: now)
        st.deadLettersRemoved(count: plan.requeued + plan.duplicates, bytes: plan.removedBytes)
        streams[name] = st
        charge(owner: st.owner, bytes: plan.addedBytes)
        release(owner: st.owner, bytes: plan.removedBytes)
        call.reply([
            "stream": .string(name), "requeued": .int(Int64(plan.requeued)), "duplicates": .int(Int64(plan.duplicates)),
            "invalid": .int(Int64(plan.invalid)), "deadLetters": .int(Int64(st.deadLetters)),
        ])
        pumpAll()
    }

    /// `{stream, ids?}`: deletes dead letters (their pages zeroed); their bytes leave the disk cap
    /// and the owner's share.
    func discard(_ call: Call) {
        guard let target = deadLetterTarget(call, "discard the dead letters of") else { return }
        let name = target.stream
        let gone: (count: Int, bytes: Int)
        do {
            gone = try store.discard(stream: name, ids: target.ids)
        } catch {
            call.fail(RPCError(.internalError, "could not discard the dead letters: \(error)"))
            return
        }
        var st = state(name)
        st.deadLettersRemoved(count: gone.count, bytes: gone.bytes)
        streams[name] = st
        release(owner: st.owner, bytes: gone.bytes)
        call.reply(["stream": .string(name), "discarded": .int(Int64(gone.count)), "deadLetters": .int(Int64(st.deadLetters))])
    }
}
