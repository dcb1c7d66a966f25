import PylonCore

/// The identifiers of an MA user. `userID` and `anonymousID` are single-valued per user;
/// a user may hold several emails, phones and devices. Each value belongs to at most one user
/// of an AppKey. The raw values are the wire names (and the `kind` column of `ma_identities`).
enum IdentityKind: String, Sendable {
    case userID = "user_id"
    case anonymousID = "anonymous_id"
    case email
    case phone
    case device

    /// The kinds a client may send in `identity`, in precedence order.
    static let sendable: [IdentityKind] = [.userID, .anonymousID, .email, .phone]

    var isSingleValued: Bool { self == .userID || self == .anonymousID }
}

/// The result for one identifier sent to identify: `{"code": N}` or `{"code": N, "msg": "..."}`.
struct FieldResult: Equatable {
    var code: MAError.Code
    var msg: String?

    static let ok = FieldResult(code: .ok)

    var json: JSON {
        var o: JSONObject = ["code": .int(Int64(code.rawValue))]
        if let msg { o["msg"] = .string(msg) }
        return .object(o)
    }
}

/// The `identity` object of start and identify, validated again on the server (docs/MA.md, `ma.identifyAccount`).
struct IdentityFields {
    /// Valid values by kind (emails lower-cased).
    var valid: [IdentityKind: String] = [:]
    /// Fields dropped by validation, with 3003 or 3013.
    var rejected: [IdentityKind: FieldResult] = [:]

    /// Validates each known field of `identity`. A null field counts as not sent; unknown
    /// keys are ignored. Length is checked before format.
    init(_ identity: JSONObject) {
        for kind in IdentityKind.sendable {
            guard let value = identity[kind.rawValue], !value.isNull else { continue }
            switch IdentityFields.check(kind, value) {
            case .valid(let v): valid[kind] = v
            case .rejected(let r): rejected[kind] = r
            }
        }
    }

    enum Checked {
        /// The value to use (an email lower-cased).
        case valid(String)
        case rejected(FieldResult)
    }

    static func check(_ kind: IdentityKind, _ value: JSON) -> Checked {
        func invalid(_ why: String) -> Checked { .rejected(FieldResult(code: .identifierInvalid, msg: why)) }
        guard let s = value.stringValue else { return invalid("identifier must be a string") }
        let limit = kind == .phone ? Limits.maxPhoneChars : Limits.maxIdentifierChars
        if s.count > limit {
            return .rejected(FieldResult(code: .identifierTooLong, msg: "identifier value exceeds the length limit"))
        }
        if s.isEmpty { return invalid("identifier is empty") }
        switch kind {
        case .email:
            let parts = s.split(separator: "@", omittingEmptySubsequences: false)
            guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty, parts[1].contains(".") else {
                return invalid("invalid email format")
            }
            return .valid(s.lowercased())
        case .phone:
            let digits = s.utf8.dropFirst()
            guard s.utf8.first == UInt8(ascii: "+"), (6...20).contains(digits.count),
                digits.allSatisfy({ (0x30...0x39).contains($0) })
            else { return invalid("invalid phone format (+ and 6 to 20 digits)") }
            return .valid(s)
        default:
            return .valid(s)
        }
    }
}

/// What the store knows about the identifiers of one request: who holds each, and the
/// single-valued identifiers of every user involved. Read inside the request's transaction.
struct IdentityGraphView {
    struct Keys: Equatable {
        var userID: String?
        var anonymousID: String?

        subscript(kind: IdentityKind) -> String? {
            switch kind {
            case .userID: userID
            case .anonymousID: anonymousID
            default: nil
            }
        }
    }

    /// The EUID holding each valid identifier value, where one does.
    var holder: [IdentityKind: String] = [:]
    /// `Keys` of the current user and of every holder.
    var users: [String: Keys] = [:]
    /// The caller's current user: the request's known `euid`, else the device's user.
    var current: String?
}

/// Resolves an identity to a user (a pure function of the fields and the graph view).
///
/// Precedence: `user_id`, then `anonymous_id`, then `email`/`phone`, then the device.
/// - user_id (likewise anonymous_id when no user_id is sent): its holder if any; else the
///   current user when that user has none; else a new user.
/// - email or phone only: the user holding the email, else the one holding the phone; else the
///   current user; else a new one.
/// - nothing: the current user (the device's), else a new one.
/// Then every valid identifier is attached to the resolved user unless another user holds it
/// (3101) or, for a single-valued kind, the user already has a different value (3102).
enum IdentityResolver {
    struct Resolution {
        /// The resolved user; nil means a new one.
        var euid: String?
        /// Identifiers to attach to it, in precedence order.
        var attach: [(kind: IdentityKind, value: String)]
        /// Results for the valid fields.
        var fields: [IdentityKind: FieldResult]
    }

    static func resolve(_ valid: [IdentityKind: String], _ graph: IdentityGraphView) -> Resolution {
        let target: String?
        if let decisive = [IdentityKind.userID, .anonymousID].first(where: { valid[$0] != nil }) {
            if let h = graph.holder[decisive] {
                target = h
            } else if let c = graph.current, graph.users[c]?[decisive] == nil {
                target = c
            } else {
                target = nil
            }
        } else if let h = graph.holder[.email] ?? graph.holder[.phone] {
            target = h
        } else {
            target = graph.current
        }

        let keys = target.flatMap { graph.users[$0] } ?? IdentityGraphView.Keys()
        var r = Resolution(euid: target, attach: [], fields: [:])
        for kind in IdentityKind.sendable {
            guard let value = valid[kind] else { continue }
            if let h = graph.holder[kind] {
                r.fields[kind] =
                    h == target
                    ? .ok : FieldResult(code: .identifierTaken, msg: "identifier belongs to another user")
            } else if kind.isSingleValued, let existing = keys[kind], existing != value {
                r.fields[kind] = FieldResult(code: .identifierConflict, msg: "user already has another \(kind.rawValue)")
            } else {
                r.attach.append((kind, value))
                r.fields[kind] = .ok
            }
        }
        return r
    }
}
