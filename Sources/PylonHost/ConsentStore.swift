import PylonCore

/// The host's consent switches: named, each granted or denied, persisted in the state directory.
///
/// `device` is the device-wide master switch: while it is denied every consent-scoped method is
/// refused, whatever its own switch says. A switch never set is granted (an SDK collects by default
/// until told otherwise). Pure value type; the host persists `snapshot` after each change.
public struct ConsentStore: Equatable, Sendable {
    public static let master = "device"

    public private(set) var switches: [String: Bool] = [:]
    /// Bumped on every effective change; plugins see it in `consent.changed`.
    public private(set) var epoch: UInt64 = 0

    public init() {}

    public func isGranted(_ key: String) -> Bool {
        if switches[ConsentStore.master] == false { return false }
        return switches[key] ?? true
    }
    public func explicitValue(_ key: String) -> Bool? { switches[key] }
    public var masterGranted: Bool { switches[ConsentStore.master] ?? true }

    /// Sets a switch; returns true when the effective value changed.
    @discardableResult
    public mutating func set(_ key: String, granted: Bool) -> Bool {
        let before = switches[key]
        switches[key] = granted
        let changed = (before ?? true) != granted
        if changed { epoch += 1 }
        return changed
    }

    /// Rules for switch names: non-empty, at most 256 bytes, printable ASCII without spaces.
    public static func validate(key: String) -> String? {
        if key.isEmpty { return "consent key must not be empty" }
        if key.utf8.count > 256 { return "consent key longer than 256 bytes" }
        for u in key.utf8 where u <= 0x20 || u >= 0x7F { return "consent key must be printable ASCII without spaces" }
        return nil
    }

    public var snapshot: JSON {
        var o = JSONObject()
        for k in switches.keys.sorted() { o[k] = .bool(switches[k]!) }
        return .object(["epoch": .int(Int64(epoch)), "switches": .object(o)])
    }

    /// Rebuilds a store from `snapshot`; nil when `j` does not have that shape.
    public static func restore(_ j: JSON) -> ConsentStore? {
        var s = ConsentStore()
        guard let o = j["switches"]?.objectValue else { return nil }
        for (k, v) in o {
            guard let b = v.boolValue else { return nil }
            s.switches[k] = b
        }
        s.epoch = UInt64(max(0, j["epoch"]?.intValue ?? 0))
        return s
    }
}
