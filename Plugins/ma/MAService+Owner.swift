import PylonPluginKit

extension MAService {
    /// `ma.setOwner {appKey, uid: N | null}` → `{code, message, appKey, ownerUid, previous}`: an
    /// admin (the host's flag only, `Ownership.mayHandOver`) hands a started AppKey to another
    /// uid, or releases it (null: the next uid to start it claims it). Persisted with the AppKey;
    /// logged with who did it. -1 for a caller that is no admin, -2 for an AppKey never started,
    /// -3 for bad params.
    func setOwner(_ call: Call) {
        let who = call.callerInfo
        guard Ownership.mayHandOver(who) else {
            call.reply(Self.result(MACode.failed, "\(who) may not hand over AppKeys: ma.setOwner is for admins (disclosure.admins)"))
            return
        }
        guard let appKey = call.params["appKey"]?.stringValue?.trimmedWhitespace, !appKey.isEmpty else {
            call.reply(Self.result(MACode.invalidParams, "appKey must be a non-empty string"))
            return
        }
        guard let handOver = Ownership.HandOver(uidParam: call.params["uid"]) else {
            call.reply(Self.result(MACode.invalidParams, Ownership.HandOver.problem))
            return
        }
        let uid = handOver.uid
        guard let inst = instances[appKey] else {
            call.reply(Self.result(MACode.notStarted, "start not called for AppKey \(appKey)"))
            return
        }
        let previous = inst.ownerUid
        if previous != uid {
            inst.ownerUid = uid
            persist(inst)
            ownerChanges += 1
            plugin.log.info(
                uid == nil ? "AppKey owner released" : "AppKey owner set",
                [
                    "appKey": appKey, "previous": previous.map { "uid:\($0)" } ?? "none", "owner": uid.map { "uid:\($0)" } ?? "none",
                    "by": who.uid.map { "uid:\($0)" } ?? who.description,
                ])
        }
        call.reply(
            Self.result(
                0, "",
                ["appKey": .string(appKey), "ownerUid": uid.map { .int($0) } ?? .null, "previous": previous.map { .int($0) } ?? .null]))
    }
}
