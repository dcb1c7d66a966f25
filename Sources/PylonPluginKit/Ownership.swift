/// Who owns a resource a plugin keeps for its callers (an uploader stream, an MA AppKey, a push
/// appId): a plugin, or a local user by uid. Written `plugin:NAME` / `uid:N` in configuration,
/// status, databases and the `setOwner` methods.
public enum Owner: Hashable, Sendable, CustomStringConvertible {
    case plugin(String)
    case uid(Int64)

    /// Parses `plugin:NAME` or `uid:N` (N ≥ 0).
    public init?(_ text: String) {
        if text.hasPrefix("plugin:"), case let name = String(text.dropFirst(7)), !name.isEmpty {
            self = .plugin(name)
        } else if text.hasPrefix("uid:"), let n = Int64(text.dropFirst(4)), n >= 0 {
            self = .uid(n)
        } else {
            return nil
        }
    }

    public var description: String {
        switch self {
        case .plugin(let p): return "plugin:\(p)"
        case .uid(let u): return "uid:\(u)"
        }
    }

    /// The uid of a user owner.
    public var uid: Int64? {
        if case .uid(let u) = self { return u }
        return nil
    }
}

/// The one ownership rule of the resources plugins keep for their callers (docs/SECURITY.md,
/// "Ownership hand-over"): a resource nobody owns is claimed by the first caller that writes it;
/// after that its owner and admins may use it, and nobody else. "Admin" is the host's flag
/// (`CallerInfo.isAdmin`, `disclosure.admins`) and nothing else: uid 0 without that flag is an
/// ordinary uid. Only an admin may hand a resource to another owner or release it (the next
/// writer claims it), `mayHandOver`. A pure value: the plugins keep the owners, this decides.
public struct Ownership: Sendable, Equatable {
    /// What a caller is, as an owner.
    public enum Identity: Sendable, Equatable {
        /// A plugin (on its own or acting for a client) is that plugin; a client is its uid
        /// (uploader streams: a plugin's streams stay the plugin's whoever it serves).
        case principal
        /// The caller's uid, also when a plugin calls on a client's behalf; a caller without a
        /// uid is nobody (MA AppKeys and push appIds are a user's).
        case uid
    }

    /// The decision for one use of a resource.
    public enum Access: Sendable, Equatable {
        /// The caller is the owner.
        case owner
        /// The caller is not the owner but an admin.
        case admin
        /// Nobody owns it and the caller's write makes it the owner.
        case claim(Owner)
        /// Nobody owns it and the rule lets this caller use it without owning it.
        case unowned
        /// The caller may not use it; `owner` is its owner (nil: nobody, and the caller may not
        /// claim it or use it unowned).
        case refused(owner: Owner?)

        /// Anything but `refused`.
        public var isAllowed: Bool {
            if case .refused = self { return false }
            return true
        }
    }

    public var identity: Identity
    /// Whether anyone may use (not claim) a resource nobody owns: true for MA's AppKeys (an
    /// AppKey started before owners were recorded); false for uploader streams (reading one
    /// nobody owns is for admins) and push appIds.
    public var unownedIsShared: Bool

    public init(identity: Identity, unownedIsShared: Bool) {
        self.identity = identity
        self.unownedIsShared = unownedIsShared
    }

    /// The caller as an owner (nil: it has no identity that can own anything).
    public func identity(of caller: CallerInfo) -> Owner? {
        switch identity {
        case .principal:
            if let p = caller.plugin { return .plugin(p) }
            return caller.uid.map { .uid($0) }
        case .uid:
            return caller.uid.map { .uid($0) }
        }
    }

    /// Whether `caller` may use a resource owned by `owner`; `claims`: the use writes, so a
    /// caller with an identity becomes the owner of a resource nobody owns.
    public func access(_ owner: Owner?, caller: CallerInfo, claims: Bool) -> Access {
        let me = identity(of: caller)
        if let owner {
            if me == owner { return .owner }
            return caller.isAdmin ? .admin : .refused(owner: owner)
        }
        if claims, let me { return .claim(me) }
        if !claims, caller.isAdmin { return .admin }
        return unownedIsShared ? .unowned : .refused(owner: nil)
    }

    /// Whether `caller` may hand a resource to another owner or release it: an admin only.
    public static func mayHandOver(_ caller: CallerInfo) -> Bool { caller.isAdmin }

    /// What a `setOwner` call's `uid` param asks for: hand over to a uid, or release.
    public enum HandOver: Equatable, Sendable {
        case uid(Int64)
        case release

        /// The new owner's uid, nil for a release.
        public var uid: Int64? {
            if case .uid(let u) = self { return u }
            return nil
        }

        /// A uid (an integer 0-4294967295) or null; nil for anything else (`problem` says why).
        public init?(uidParam v: JSON?) {
            if case .null? = v {
                self = .release
            } else if let u = v?.intValue, u >= 0, u <= Int64(UInt32.max) {
                self = .uid(u)
            } else {
                return nil
            }
        }

        public static let problem = "uid must be a uid (an integer 0-4294967295) or null (release)"
    }

    /// The rule of uploader streams.
    public static let streams = Ownership(identity: .principal, unownedIsShared: false)
    /// The rule of MA AppKeys.
    public static let appKeys = Ownership(identity: .uid, unownedIsShared: true)
    /// The rule of push appIds.
    public static let pushApps = Ownership(identity: .uid, unownedIsShared: false)
}
