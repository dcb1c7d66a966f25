/// Dispatch of the data routes beyond the event search (`Backend+Events.swift`).
extension Backend {
    /// The periodic jobs `runJobs` runs, in order.
    var dataJobs: [(Backend) -> Void] {
        [{ $0.runErasures() }, { $0.runRetention() }, { $0.runScheduledPushes() }, { $0.runAutomation() }]
    }

    func moreData(_ request: HTTPRequest, _ r: DataRoute, _ principal: Principal) throws(APIError) -> HTTPResponse {
        switch r {
        case .events, .eventsTail: throw .notFound(request.path)
        case .users: return try userList(request)
        case .user(let appKey, let euid): return try userDetail(request, appKey: appKey, euid: euid)
        case .createErasure: return try createErasure(request, principal)
        case .erasures: return try erasureList(request)
        case .erasure(let id): return try erasureDetail(request, id: id)
        case .optouts: return try optOutList(request)
        case .appSettings(let appKey): return try appSettings(appKey: appKey)
        case .setAppSettings(let appKey): return try setAppSettings(request, appKey: appKey, principal)
        case .retention: return try retention()
        case .setRetention: return try setRetention(request, principal)
        case .analytics(let appKey, let kind): return try analytics(request, appKey: appKey, kind)
        case .pushMessages: return try pushMessages(request)
        case .pushMessage(let id): return try pushMessage(request, id: id)
        case .pushWhy: return try pushWhy(request)
        case .schedulePush: return try schedulePush(request, principal)
        case .scheduledPushes: return try scheduledPushes(request)
        case .cancelScheduled(let id): return try cancelScheduled(request, id: id, principal)
        case .automation(let a): return try automationRoute(request, a, principal)
        }
    }
}
