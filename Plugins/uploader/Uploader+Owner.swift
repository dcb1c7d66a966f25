import PylonPluginKit

/// `uploader.setOwner`: an admin hands a stream to another owner or releases it (the next writer
/// claims it). The kit's rule says who may (`Ownership.mayHandOver`: the host's admin flag only);
/// the queue database keeps the new owner across restarts; the log says who did it.
extension Uploader {
    /// `{stream, owner: "uid:N" | "plugin:NAME" | null}` → `{stream, owner, previous}`.
    func setOwner(_ call: Call) {
        let who = call.callerInfo
        guard Ownership.mayHandOver(who) else {
            call.fail(RPCError(.notPermitted, "\(who) may not hand over streams: uploader.setOwner is for admins (disclosure.admins)"))
            return
        }
        let p = call.params
        guard let stream = p["stream"]?.stringValue, Uploader.validStream(stream) else {
            call.fail(RPCError(.invalidParams, "params.stream must be a stream name (1-128 of [A-Za-z0-9._:-])"))
            return
        }
        let owner: StreamOwner?
        if case .null? = p["owner"] {
            owner = nil
        } else if let o = p["owner"]?.stringValue.flatMap(StreamOwner.init) {
            owner = o
        } else {
            call.fail(RPCError(.invalidParams, "params.owner must be \"uid:N\", \"plugin:NAME\" or null (release)"))
            return
        }
        if let fixed = config.catalog.fixedOwner(of: stream) {
            call.fail(
                RPCError(
                    .invalidParams, "stream \(stream) belongs to \(fixed) by configuration or by its namespace; it cannot be handed over",
                    data: ["stream": .string(stream), "owner": .string(fixed.description)]))
            return
        }
        // Enqueues waiting for the group commit are charged to the owner they were accepted for.
        commit()
        var st = state(stream)
        let previous = st.owner
        if previous != owner {
            do {
                try store.setOwner(stream: stream, owner: owner?.description, nowMs: System.wallClockMs())
            } catch {
                plugin.log.error("cannot record a stream owner", ["stream": stream, "error": "\(error)"])
                call.fail(RPCError(.internalError, "could not record the owner of stream \(stream)"))
                return
            }
            ledger.handOver(from: previous, to: owner, bytes: st.diskBytes + st.deadLetterBytes)
            recordedOwners[stream] = owner
            st.owner = owner
            if streams[stream] != nil { streams[stream] = st }
            ownerChanges += 1
            plugin.log.info(
                owner == nil ? "stream owner released" : "stream owner set",
                [
                    "stream": stream, "previous": previous?.description ?? "none", "owner": owner?.description ?? "none",
                    "by": who.uid.map { "uid:\($0)" } ?? who.description,
                ])
        }
        call.reply([
            "stream": .string(stream), "owner": owner.map { .string($0.description) } ?? .null,
            "previous": previous.map { .string($0.description) } ?? .null,
        ])
    }
}
