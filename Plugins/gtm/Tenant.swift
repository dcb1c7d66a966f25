import PylonCore
import PylonPluginKit
import PylonTagEngine

/// Whose tag-manager state a call addresses: a local user (a client's uid, or the uid a plugin
/// acts for), or a plugin acting on its own behalf. Every piece of GTM state — open containers,
/// previews, the data layer and its queue, function-call handlers, the log level and log lines,
/// saved containers and `gtm.lifetime` values — belongs to exactly one owner (docs/SECURITY.md,
/// "Tag manager").
enum Owner: Hashable, Sendable, CustomStringConvertible {
    case uid(Int64)
    case plugin(String)

    var description: String {
        switch self {
        case .uid(let u): return "uid \(u)"
        case .plugin(let p): return "plugin \(p.isEmpty ? "(unknown)" : p)"
        }
    }

    /// The owner as stored in `gtm.db` (`uid:4242`, `plugin:ma`).
    var key: String {
        switch self {
        case .uid(let u): return "uid:\(u)"
        case .plugin(let p): return "plugin:" + p
        }
    }

    init?(key: String) {
        if key.hasPrefix("uid:"), let u = Int64(key.dropFirst(4)) {
            self = .uid(u)
        } else if key.hasPrefix("plugin:") {
            self = .plugin(String(key.dropFirst(7)))
        } else {
            return nil
        }
    }

    /// `{"uid": N}` or `{"plugin": name}` (in `gtm.status` and log lines).
    var json: JSONObject {
        switch self {
        case .uid(let u): return ["uid": .int(u)]
        case .plugin(let p): return ["plugin": .string(p)]
        }
    }

    /// Sorts uids first (ascending), then plugins by name.
    static func ordered(_ a: Owner, _ b: Owner) -> Bool {
        switch (a, b) {
        case (.uid(let x), .uid(let y)): return x < y
        case (.uid, .plugin): return true
        case (.plugin, .uid): return false
        case (.plugin(let x), .plugin(let y)): return x < y
        }
    }
}

/// Who called, as the host's `_pylon` says, and which owner's state the call addresses.
struct Caller {
    /// The state this call reads and changes (the caller's own, or with `uid` an admin's choice).
    let owner: Owner
    /// The caller's own owner (differs from `owner` only for an admin using `uid`).
    let selfOwner: Owner
    let admin: Bool
    let client: Int64?

    /// The caller of `call`: a client (or a plugin acting for one) is its uid; a plugin on its
    /// own behalf is its own namespace, never a uid's. `params.uid` addresses another uid's
    /// state and is for admin clients only (-32005 otherwise).
    static func of(_ call: Call) -> Result<Caller, RPCError> {
        let info = call.callerInfo
        let own: Owner
        if let u = info.uid {
            own = .uid(u)
        } else {
            own = .plugin(info.plugin ?? "")
        }
        let admin = info.uid != nil && info.admin == true
        var owner = own
        if call.hasParam("uid") {
            guard let u = call.params["uid"]?.intValue, u >= 0 else {
                return .failure(RPCError(.invalidParams, "uid must be a non-negative integer"))
            }
            guard admin || own == .uid(u) else {
                return .failure(RPCError(.notPermitted, "only an admin may address another uid's tag-manager state"))
            }
            owner = .uid(u)
        }
        return .success(Caller(owner: owner, selfOwner: own, admin: admin, client: info.client))
    }
}

/// One owner's tag-manager state (see `Owner`).
final class Tenant {
    let owner: Owner
    var instances: [String: ContainerInstance] = [:]
    /// Preview URLs given before (or while) their container is open, by container id.
    var previews: [String: PreviewState] = [:]

    var dataLayer = DataLayer()
    /// At least the data layer's size as JSON text with the queued pushes merged: raised by each
    /// push's size, measured again when it would pass `maxDataLayerBytes` (a merge that replaces
    /// keys adds less than the push's size).
    var dataLayerBytesBound = 0
    var pushQueue: PushQueue<QueuedPush>
    var pushSeq: UInt64 = 0
    /// The unanswered `gtm.push` calls of the queued pushes, by push seq (GTMService+Hits).
    var pushAcks: [UInt64: GTMService.PushAck] = [:]
    var processing = false

    var macroHandlers: [String: GTMService.Handler] = [:] { didSet { macroNames = Set(macroHandlers.keys) } }
    /// The names in `macroHandlers` (what evaluation contexts carry).
    var macroNames = Set<String>()
    var tagHandlers: [String: GTMService.Handler] = [:]
    var counters = GTMService.Counters()

    init(owner: Owner, maxQueuedPushes: Int) {
        self.owner = owner
        pushQueue = PushQueue(limit: maxQueuedPushes)
    }
}

extension GTMService {
    /// The tenant of `owner`, made on first use when `create` (at most `maxOwners`: one more is
    /// -32004). nil (and `call` answered) when it cannot be made; nil, unanswered, when it does
    /// not exist and `create` is false.
    func tenant(_ owner: Owner, create: Bool, _ call: Call? = nil) -> Tenant? {
        if let t = tenants[owner] { return t }
        guard create else { return nil }
        guard tenants.count < limits.maxOwners else {
            call?.fail(
                RPCError(.overloaded, "too many tag-manager owners (maxOwners \(limits.maxOwners))", data: ["limit": "maxOwners"]))
            return nil
        }
        let t = Tenant(owner: owner, maxQueuedPushes: limits.maxQueuedPushes)
        tenants[owner] = t
        return t
    }

    /// The caller of `call`, or nil with `call` answered.
    func caller(_ call: Call) -> Caller? {
        switch Caller.of(call) {
        case .success(let c): return c
        case .failure(let e):
            call.fail(e)
            return nil
        }
    }
}

extension GTMService {
    /// `gtm.setLogLevel {level, uid?}`: the level of the caller's own lines (an admin's `uid`:
    /// that uid's). Nobody else's lines change.
    func setLogLevel(_ call: Call) {
        guard let who = caller(call) else { return }
        guard let s = call.params["level"]?.stringValue, let l = GTMLogLevel(rawValue: s) else {
            call.fail(RPCError(.invalidParams, "level must be verbose, debug, info, warning, error or none"))
            return
        }
        log.setLevel(l, for: who.owner)
        call.reply(["level": .string(l.rawValue)])
    }

    /// `gtm.logLines {since?, limit?, uid?, all?}`: the caller's own recent log lines after
    /// sequence number `since` (oldest first), `{lines: [{seq, level, message, ts, uid|plugin}],
    /// next}`; `next` is the `since` of the following call. Admins: `uid` for that uid's lines,
    /// `all: true` for every owner's and the plugin-wide ones.
    func logLines(_ call: Call) {
        guard let who = caller(call) else { return }
        let all = call.params["all"]?.boolValue == true
        if all && !who.admin {
            call.fail(RPCError(.notPermitted, "only an admin may read every owner's log lines"))
            return
        }
        let since = call.params["since"]?.intValue ?? 0
        let limit = Int(min(max(call.params["limit"]?.intValue ?? Int64(limits.maxLogLinesPerOwner), 1), 10_000))
        let lines = log.lines(of: who.owner, all: all, since: since, limit: limit)
        call.reply(["lines": .array(lines.map(\.json)), "next": .int(lines.last?.seq ?? since)])
    }
}
