import PylonPluginKit

extension MAService {
    /// `ma.status`: what the plugin is doing, per AppKey — for people and `pylonctl call ma.status`.
    /// No identities (EUID, project, identifiers): any client may call it, and apps must not see
    /// each other's identity.
    func status(_ call: Call) {
        var apps = JSONObject()
        // Only the AppKeys the caller may use: another user's are not listed.
        for (k, i) in instances.sorted(by: { $0.key < $1.key }) where mayUse(i, call) {
            apps[k] = [
                "started": .bool(i.started), "collectionEnabled": i.collectionEnabled.map { .bool($0) } ?? .null,
                "pendingStarts": .int(Int64(i.pendingStarts)), "queuedChannelValues": .int(Int64(i.channelQueue.count)),
                "session": i.sessionId.map { .string($0) } ?? .null, "background": .bool(i.background),
                "sessionTimeoutS": .int(i.sessionTimeoutS), "reportIntervalS": i.reportIntervalS.map { .int($0) } ?? .null,
                "clients": .int(Int64(clientCount(k))), "ownerUid": i.ownerUid.map { .int($0) } ?? .null,
                "waitingForNetwork": i.networkWait?.json ?? .null, "parkedEvents": .int(Int64(i.parked)),
            ]
        }
        call.reply([
            "backend": .string(config.backend), "appKeys": .object(apps),
            "heldEvents": .int(Int64(held)), "maxHeldEvents": .int(Int64(config.maxHeldEvents)),
            "waitingEvents": .int(Int64(outboxCount)), "eventsWaitingForStart": .int(Int64(parkedTotal)),
            "maxParkedEvents": .int(Int64(config.maxParkedEvents)), "duplicateEvents": .int(Int64(duplicateEvents)),
            "parkedDropped": .int(Int64(parkedDropped)),
            "maxEnqueuesInFlight": .int(Int64(config.maxEnqueuesInFlight)),
            "enqueues": .int(Int64(enqueuesSent)), "enqueuedEvents": .int(Int64(eventsEnqueued)),
            "ownerChanges": .int(Int64(ownerChanges)),
        ])
    }
}
