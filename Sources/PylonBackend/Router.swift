import PylonProtocol

/// The backend's endpoints, one case per (method, path template).
enum Endpoint: Equatable {
    case health
    /// `POST /v1/devices/register`: a device credential for an install (`Backend+Devices.swift`).
    case deviceRegister
    /// `POST /v1/admin/devices/{installId}/reenrol`: an operator's approval (`Backend+Devices.swift`).
    case deviceReenrol(installId: String)
    /// `GET|POST /v1/admin/enrolment-keys`, `DELETE /v1/admin/enrolment-keys/{id}`
    /// (`Backend+EnrolmentKeys.swift`).
    case enrolmentKeys(id: String?)
    case ingest(stream: String)
    case inspectStream(String)
    case inspectRecords(String)
    case stats
    case reset
    case getFaults, setFaults, clearFaults
    /// `POST /v1/ma/{appKey}/{call}`.
    case maCall(appKey: String, MACall)
    case maGetApp(appKey: String), maSetApp(appKey: String)
    case maGetMetadata(appKey: String), maSetMetadata(appKey: String)
    case maFindUser(appKey: String)
    case maInspectUser(appKey: String, euid: String)
    /// `POST /v1/push/{register|bind|unbind|liveactivity}` (device side).
    case pushCall(String)
    /// `POST /v1/admin/push/send`.
    case pushSend
    /// `GET /v1/inspect/push/{bindings|sends|deliveries|opens}`.
    case pushInspect(String)
    /// Tag-manager containers (Backend+GTM.swift).
    case gtmPublished(id: String), gtmDraft(id: String), gtmPublish(id: String), gtmInspect(id: String)
    /// The console's data routes (`Router+Data.swift`).
    case data(DataRoute)
    /// The console's own routes (`Router+Console.swift`).
    case console(ConsoleRoute)
}

/// Maps a method and path to an `Endpoint`. A value type with no I/O.
enum Router {
    enum Match: Equatable {
        case endpoint(Endpoint)
        /// The path exists but not with this method; `allowed` lists the methods it takes.
        case methodNotAllowed(allowed: [String])
        case notFound
        /// A path parameter is not acceptable (for example an over-long stream name).
        case badParameter(String)
    }

    /// Matches a request. Path segments are percent-decoded; `{stream}` and `{euid}` must be
    /// 1 to `Limits.maxNameBytes` bytes without control characters; `{appKey}` 1 to
    /// `AppKey.maxBytes` bytes of `[A-Za-z0-9._-]`.
    static func match(method: String, path: Substring) -> Match {
        guard let segs = segments(path) else { return .badParameter("invalid percent-encoding in the path") }
        func pick(_ table: [(String, Endpoint)]) -> Match {
            if let e = table.first(where: { $0.0 == method }) { return .endpoint(e.1) }
            return .methodNotAllowed(allowed: table.map(\.0))
        }
        func stream(_ s: String, _ build: (String) -> [(String, Endpoint)]) -> Match {
            if let why = invalidName(s, what: "stream name") { return .badParameter(why) }
            return pick(build(s))
        }
        func app(_ s: String, _ build: (String) -> [(String, Endpoint)]) -> Match {
            if let why = invalidAppKey(s) { return .badParameter(why) }
            return pick(build(s))
        }
        func starts(_ fixed: String...) -> Bool { segs.starts(with: fixed) }
        if let m = matchData(method: method, segs) { return m }
        if let m = matchConsole(method: method, segs) { return m }
        switch segs.count {
        case 1 where starts("healthz"): return pick([("GET", .health)])
        case 3 where starts("v1", "devices", "register"): return pick([("POST", .deviceRegister)])
        case 3 where starts("v1", "batches"): return stream(segs[2]) { [("POST", .ingest(stream: $0))] }
        case 3 where starts("v1", "inspect", "stats"): return pick([("GET", .stats)])
        case 3 where starts("v1", "admin", "reset"): return pick([("POST", .reset)])
        case 5 where starts("v1", "admin", "devices") && segs[4] == "reenrol":
            guard Backend.isValidInstallId(segs[3]) else { return .badParameter("installId must be 1 to 64 of [A-Za-z0-9._-]") }
            return pick([("POST", .deviceReenrol(installId: segs[3]))])
        case 3 where starts("v1", "admin", "enrolment-keys"):
            return pick([("GET", .enrolmentKeys(id: nil)), ("POST", .enrolmentKeys(id: nil))])
        case 4 where starts("v1", "admin", "enrolment-keys"):
            guard segs[3].utf8.count == 16, DeviceToken.isHex(segs[3][...]) else {
                return .badParameter("an enrolment key id is 16 hex digits")
            }
            return pick([("DELETE", .enrolmentKeys(id: segs[3]))])
        case 2 where starts("v1", "faults"): return pick([("GET", .getFaults), ("POST", .setFaults), ("DELETE", .clearFaults)])
        case 4 where starts("v1", "inspect", "streams"): return stream(segs[3]) { [("GET", .inspectStream($0))] }
        case 5 where starts("v1", "inspect", "streams") && segs[4] == "records":
            return stream(segs[3]) { [("GET", .inspectRecords($0))] }
        case 4 where starts("v1", "ma"):
            guard let call = MACall(rawValue: segs[3]) else { return .notFound }
            return app(segs[2]) { [("POST", .maCall(appKey: $0, call))] }
        case 4 where starts("v1", "admin", "ma"):
            return app(segs[3]) { [("GET", .maGetApp(appKey: $0)), ("POST", .maSetApp(appKey: $0))] }
        case 5 where starts("v1", "admin", "ma") && segs[4] == "metadata":
            return app(segs[3]) { [("GET", .maGetMetadata(appKey: $0)), ("POST", .maSetMetadata(appKey: $0))] }
        case 5 where starts("v1", "inspect", "ma") && segs[4] == "users":
            return app(segs[3]) { [("GET", .maFindUser(appKey: $0))] }
        case 6 where starts("v1", "inspect", "ma") && segs[4] == "users":
            if let why = invalidName(segs[5], what: "euid") { return .badParameter(why) }
            return app(segs[3]) { [("GET", .maInspectUser(appKey: $0, euid: segs[5]))] }
        case 3 where starts("v1", "push"):
            guard ["register", "bind", "unbind", "liveactivity"].contains(segs[2]) else { return .notFound }
            return pick([("POST", .pushCall(segs[2]))])
        case 4 where starts("v1", "admin", "push", "send"): return pick([("POST", .pushSend)])
        case 4 where starts("v1", "inspect", "push"):
            guard ["bindings", "sends", "deliveries", "opens"].contains(segs[3]) else { return .notFound }
            return pick([("GET", .pushInspect(segs[3]))])
        case 4 where starts("v1", "gtm", "containers"): return gtm(segs[3]) { [("GET", .gtmPublished(id: $0))] }
        case 5 where starts("v1", "gtm", "containers") && segs[4] == "draft": return gtm(segs[3]) { [("GET", .gtmDraft(id: $0))] }
        case 6 where starts("v1", "admin", "gtm", "containers") && segs[5] == "versions":
            return gtm(segs[4]) { [("GET", .console(.containerVersions(id: $0))), ("POST", .gtmPublish(id: $0))] }
        case 5 where starts("v1", "inspect", "gtm", "containers"): return gtm(segs[4]) { [("GET", .gtmInspect(id: $0))] }
        default: return .notFound
        }
        func gtm(_ s: String, _ build: (String) -> [(String, Endpoint)]) -> Match {
            if invalidAppKey(s) != nil { return .badParameter("container id must be \(AppKey.rule)") }
            return pick(build(s))
        }
    }

    /// Why `s` is not an acceptable MA AppKey, or nil.
    static func invalidAppKey(_ s: String) -> String? {
        AppKey.isValid(s) ? nil : "appKey must be \(AppKey.rule)"
    }

    /// The percent-decoded segments of `path` after its leading `/` (`+` is literal); nil when
    /// an escape is malformed.
    static func segments(_ path: Substring) -> [String]? {
        var segs: [String] = []
        for s in path.split(separator: "/", omittingEmptySubsequences: false).dropFirst() {
            guard let d = percentDecode(s, plusIsSpace: false) else { return nil }
            segs.append(d)
        }
        return segs
    }

    /// Control and inspection paths (`/healthz`, `/metrics`, `/v1/faults`, `/v1/session...`,
    /// `/v1/inspect/...`, `/v1/admin/...`), which injected faults never touch. Decided on the
    /// decoded segments, as routing is, so an escaped spelling of an exempt path is exempt too.
    static func isFaultExempt(_ path: Substring) -> Bool {
        guard let segs = segments(path) else { return false }
        if segs == ["healthz"] || segs == ["metrics"] || segs == ["v1", "faults"] { return true }
        if segs.count >= 2 && segs[0] == "v1" && segs[1] == "session" { return true }
        return segs.count > 2 && segs[0] == "v1" && (segs[1] == "inspect" || segs[1] == "admin")
    }

    /// Why `s` is not an acceptable name (stream, idempotency key, record id), or nil.
    static func invalidName(_ s: String, what: @autoclosure () -> String) -> String? {
        var s = s
        return s.withUTF8 { invalidName(UnsafeRawBufferPointer($0), what: what()) }
    }

    /// `invalidName` of a name's UTF-8 bytes (a record id read from a batch body), which words
    /// `what` only for a name it refuses.
    static func invalidName(_ s: UnsafeRawBufferPointer, what: @autoclosure () -> String) -> String? {
        if s.isEmpty { return "\(what()) is empty" }
        if s.count > Limits.maxNameBytes { return "\(what()) exceeds \(Limits.maxNameBytes) bytes" }
        if s.contains(where: { $0 < 0x20 || $0 == 0x7F }) { return "\(what()) contains control characters" }
        return nil
    }
}
