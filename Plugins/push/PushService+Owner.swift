import PylonPluginKit
import PylonStore

extension PushService {
    /// `push.setOwner {appId, uid: N | null}` → `{code, appId, ownerUid, previous}`: an admin (the
    /// host's flag only, `Ownership.mayHandOver`) hands an appId to another uid, or releases it
    /// (null: the next uid to attach it claims it). A client of another uid attached to it is
    /// detached (its messages wait in the inbox for the new owner). Persisted in `push.db`;
    /// logged with who did it. 3003 for a caller that is no admin, 3002 for bad params or an
    /// appId no uid ever attached.
    func setOwner(_ call: Call) {
        let who = call.callerInfo
        guard Ownership.mayHandOver(who) else {
            call.reply(reply(PushCode.notPermitted, "\(who) may not hand over apps: push.setOwner is for admins (disclosure.admins)"))
            return
        }
        guard let appId = call.params["appId"]?.stringValue, appId.isValidPushId else {
            call.reply(reply(PushCode.invalidParams, "appId must be 1-128 of [A-Za-z0-9._-]"))
            return
        }
        guard let handOver = Ownership.HandOver(uidParam: call.params["uid"]) else {
            call.reply(reply(PushCode.invalidParams, Ownership.HandOver.problem))
            return
        }
        let uid = handOver.uid
        guard let previous = store.appOwner(appId) else {
            call.reply(reply(PushCode.invalidParams, "appId \(appId) has no owner: no uid attached it yet"))
            return
        }
        if previous != uid {
            if let a = attached[appId], a.uid != uid { detachApp(appId) }
            do throws(SQLiteError) {
                if let uid {
                    let a = attached[appId]
                    try store.setApp(appId, uid: uid, client: a?.client, callback: a?.callback)
                    if a != nil { attached[appId]?.uid = uid }
                } else {
                    try store.removeApp(appId)
                }
            } catch {
                call.reply(reply(PushCode.limit, "cannot record the owner: \(error.description)"))
                return
            }
            ownerChanges += 1
            plugin.log.info(
                uid == nil ? "appId owner released" : "appId owner set",
                [
                    "appId": appId, "previous": "uid:\(previous)", "owner": uid.map { "uid:\($0)" } ?? "none",
                    "by": who.uid.map { "uid:\($0)" } ?? who.description,
                ])
            arm()
        }
        call.reply(
            reply(PushCode.ok, "", ["appId": .string(appId), "ownerUid": uid.map { .int($0) } ?? .null, "previous": .int(previous)]))
    }
}

extension PushStore {
    /// Forgets `appId`'s owner and attachment (`push.setOwner` with null).
    func removeApp(_ appId: String) throws(SQLiteError) { try db.run("DELETE FROM apps WHERE app_id = ?", [.text(appId)]) }
}
