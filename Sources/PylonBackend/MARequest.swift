import PylonCore

/// The MA calls, `POST /v1/ma/{appKey}/{call}`.
enum MACall: String {
    case start, identify, contacts, channel, properties
}

/// The bodies of the MA calls, validated (pure). A missing or mistyped field is -3; property
/// content errors are 40xx (see `PropertyOp.parse`). Every body may carry `project`.
enum MARequest {
    struct Start {
        var deviceID: String
        var identity: IdentityFields
    }

    struct Identify {
        var deviceID: String
        /// The caller's current EUID (may be unknown to the server).
        var euid: String?
        var identity: IdentityFields
    }

    struct Contacts {
        var euid: String
        /// By kind: a value to store, or nil to clear (`""`). Kinds sent as null are left out.
        var changes: [(kind: String, value: String?)]
    }

    struct Channel {
        var euid: String
        var channelID: Int64
        var values: [String]
    }

    struct Properties {
        var euid: String
        var op: PropertyOp
    }

    static func start(_ o: JSONObject) throws(MAError) -> Start {
        try checkProject(o)
        let identity: JSONObject
        switch o["identity"] {
        case nil, .null?: identity = JSONObject()
        case .object(let i)?: identity = i
        default: throw .invalid("identity must be an object")
        }
        return Start(deviceID: try deviceID(o), identity: IdentityFields(identity))
    }

    static func identify(_ o: JSONObject) throws(MAError) -> Identify {
        try checkProject(o)
        let euid: String?
        switch o["euid"] {
        case nil, .null?: euid = nil
        case .string(let s)?: euid = s
        default: throw .invalid("euid must be a string or null")
        }
        guard let identity = o["identity"]?.objectValue else { throw .invalid("identity must be an object") }
        return Identify(deviceID: try deviceID(o), euid: euid, identity: IdentityFields(identity))
    }

    /// `contacts`: kind (1 to 256 characters) to string; `""` clears, null leaves unchanged, a
    /// non-empty value of only whitespace is invalid.
    static func contacts(_ o: JSONObject) throws(MAError) -> Contacts {
        try checkProject(o)
        guard let c = o["contacts"]?.objectValue else { throw .invalid("contacts must be an object") }
        var changes: [(kind: String, value: String?)] = []
        for (kind, v) in c {
            guard (1...Limits.maxIdentifierChars).contains(kind.count) else {
                throw .invalid("contact kind must be 1 to \(Limits.maxIdentifierChars) characters")
            }
            switch v {
            case .null: continue
            case .string(let s) where s.isEmpty: changes.append((kind, nil))
            case .string(let s) where s.allSatisfy(\.isWhitespace): throw .invalid("contact \(kind) is only whitespace")
            case .string(let s): changes.append((kind, s))
            default: throw .invalid("contact \(kind) must be a string")
            }
        }
        return Contacts(euid: try euid(o), changes: changes)
    }

    static func channel(_ o: JSONObject) throws(MAError) -> Channel {
        try checkProject(o)
        guard let channelID = o["channelId"]?.intValue, channelID > 0 else {
            throw .invalid("channelId must be an integer > 0")
        }
        guard let a = o["values"]?.arrayValue, !a.isEmpty else { throw .invalid("values must be a non-empty array") }
        var values: [String] = []
        for v in a {
            guard let s = v.stringValue, !s.allSatisfy(\.isWhitespace) else {
                throw .invalid("values must be non-empty strings")
            }
            values.append(s)
        }
        return Channel(euid: try euid(o), channelID: channelID, values: values)
    }

    static func properties(_ o: JSONObject) throws(MAError) -> Properties {
        try checkProject(o)
        let e = try euid(o)
        return Properties(euid: e, op: try PropertyOp.parse(o))
    }

    // MARK: Fields

    /// `project`, when present, is a string of 1 to `Limits.maxMAKeyChars` characters.
    static func checkProject(_ o: JSONObject) throws(MAError) {
        guard let p = o["project"], !p.isNull else { return }
        guard let s = p.stringValue, (1...Limits.maxMAKeyChars).contains(s.count) else {
            throw .invalid("project must be a string of 1 to \(Limits.maxMAKeyChars) characters")
        }
    }

    private static func deviceID(_ o: JSONObject) throws(MAError) -> String {
        guard let d = o["deviceId"]?.stringValue, (1...Limits.maxMAKeyChars).contains(d.count) else {
            throw .invalid("deviceId must be a string of 1 to \(Limits.maxMAKeyChars) characters")
        }
        return d
    }

    private static func euid(_ o: JSONObject) throws(MAError) -> String {
        guard let e = o["euid"]?.stringValue, !e.isEmpty else { throw .invalid("euid must be a non-empty string") }
        return e
    }
}
