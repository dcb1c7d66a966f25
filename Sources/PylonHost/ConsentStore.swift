import PylonCore

/// The host's consent switches: named, each granted or denied, persisted in the state directory.
///
/// Two layers decide a switch. The operator's layer (`consent.set`, guarded by permission rules)
/// and the app's layer (`consent.setApp`, set by the plugin that owns the switch's namespace on an
/// app's behalf, e.g. MA's `setDataCollectionEnabled` for `ma:<appKey>`). A switch is granted only
/// when both layers grant it (a layer never set grants), so an app can narrow collection but never
/// re-grant what the operator denied.
///
/// `device` is the device-wide master switch, operator-only: while it is denied every
/// consent-scoped method is refused, whatever its own switch says. Pure value type; the host
/// persists `snapshot` after each change.
public struct ConsentStore: Equatable, Sendable {
    public static let master = "device"

    public enum Layer: String, Sendable {
        case operatorLayer = "operator"
        case app
    }

    /// The operator's decisions.
    public private(set) var switches: [String: Bool] = [:]
    /// The apps' decisions (set through their plugins).
    public private(set) var appSwitches: [String: Bool] = [:]
    /// Bumped on every effective change; plugins see it in `consent.changed`.
    public private(set) var epoch: UInt64 = 0

    public init() {}

    /// The switch's own value (both layers), ignoring the master switch.
    public func ownValue(_ key: String) -> Bool { (switches[key] ?? true) && (appSwitches[key] ?? true) }

    public func isGranted(_ key: String) -> Bool { masterGranted && ownValue(key) }
    public func explicitValue(_ key: String) -> Bool? { switches[key] }
    public func appValue(_ key: String) -> Bool? { appSwitches[key] }
    public var masterGranted: Bool { switches[ConsentStore.master] ?? true }

    /// Every switch that either layer set, with its own value (master excluded from neither).
    public var effective: [String: Bool] {
        var o: [String: Bool] = [:]
        for k in switches.keys { o[k] = ownValue(k) }
        for k in appSwitches.keys { o[k] = ownValue(k) }
        return o
    }

    /// Sets a switch in `layer`; returns true when its effective value changed. The master
    /// switch has no app layer.
    @discardableResult
    public mutating func set(_ key: String, granted: Bool, layer: Layer = .operatorLayer) -> Bool {
        let before = key == ConsentStore.master ? masterGranted : ownValue(key)
        switch layer {
        case .operatorLayer: switches[key] = granted
        case .app: appSwitches[key] = granted
        }
        let after = key == ConsentStore.master ? masterGranted : ownValue(key)
        // Past `maxEpoch` (a file edited by hand could start near it) the epoch stays: it is JSON
        // and Int64 wherever it is shown, and a counter of changes never gets there otherwise.
        if before != after, epoch < ConsentStore.maxEpoch { epoch += 1 }
        return before != after
    }

    /// Returns a switch of `layer` to "never set" (the default, granted, unless the other layer
    /// says otherwise); returns true when its effective value changed.
    @discardableResult
    public mutating func clear(_ key: String, layer: Layer = .operatorLayer) -> Bool {
        let before = key == ConsentStore.master ? masterGranted : ownValue(key)
        switch layer {
        case .operatorLayer: switches[key] = nil
        case .app: appSwitches[key] = nil
        }
        let after = key == ConsentStore.master ? masterGranted : ownValue(key)
        if before != after, epoch < ConsentStore.maxEpoch { epoch += 1 }
        return before != after
    }

    /// The largest epoch a consent file may hold: an exact integer in every JSON reader (2^53),
    /// far from Int64's end, where the next change would trap (a hand-edited file did).
    public static let maxEpoch: Int64 = 1 << 53

    /// Rules for switch names: non-empty, at most 256 bytes, printable ASCII without spaces.
    public static func validate(key: String) -> String? {
        if key.isEmpty { return "consent key must not be empty" }
        if key.utf8.count > 256 { return "consent key longer than 256 bytes" }
        for u in key.utf8 where u <= 0x20 || u >= 0x7F { return "consent key must be printable ASCII without spaces" }
        return nil
    }

    public var snapshot: JSON {
        func map(_ d: [String: Bool]) -> JSON {
            var o = JSONObject()
            for k in d.keys.sorted() { o[k] = .bool(d[k]!) }
            return .object(o)
        }
        return .object(["epoch": .int(Int64(epoch)), "switches": map(switches), "app": map(appSwitches)])
    }

    /// Rebuilds a store from `snapshot`; nil (with the reason) when `j` does not have that shape:
    /// a non-negative integer `epoch`, a `switches` object of valid keys to booleans, and an
    /// optional `app` object of the same kind.
    public static func restore(_ j: JSON) -> Result<ConsentStore, RestoreError> {
        var s = ConsentStore()
        guard let o = j["switches"]?.objectValue else { return .failure(RestoreError("switches must be an object")) }
        func layer(_ o: JSONObject, _ name: String) -> Result<[String: Bool], RestoreError> {
            var d: [String: Bool] = [:]
            for (k, v) in o {
                if let why = validate(key: k) { return .failure(RestoreError("\(name).\(k): \(why)")) }
                guard let b = v.boolValue else { return .failure(RestoreError("\(name).\(k) must be true or false")) }
                d[k] = b
            }
            return .success(d)
        }
        switch layer(o, "switches") {
        case .success(let d): s.switches = d
        case .failure(let e): return .failure(e)
        }
        if let a = j["app"] {
            guard let ao = a.objectValue else { return .failure(RestoreError("app must be an object")) }
            switch layer(ao, "app") {
            case .success(let d): s.appSwitches = d
            case .failure(let e): return .failure(e)
            }
            if s.appSwitches[master] != nil { return .failure(RestoreError("app.\(master): the master switch has no app layer")) }
        }
        if let e = j["epoch"] {
            guard let n = e.intValue, n >= 0, n <= ConsentStore.maxEpoch else {
                return .failure(RestoreError("epoch must be an integer from 0 to \(ConsentStore.maxEpoch)"))
            }
            s.epoch = UInt64(n)
        }
        return .success(s)
    }

    /// Reads the consent file's bytes: JSON without a key given twice, in the `snapshot` shape
    /// (`restore`). The failure says what is wrong with the file, for the log; the host then
    /// fails closed (`failedClosed`).
    public static func read(fileBytes bytes: [UInt8]) -> Result<ConsentStore, RestoreError> {
        if let dup = bytes.withUnsafeBytes({ RawJSON.duplicateKey(in: $0) }) {
            return .failure(RestoreError("damaged (key \(dup) appears twice)"))
        }
        guard let parsed = try? bytes.withUnsafeBytes({ b throws(JSONParseError) in try JSONRef.parse(b).json }) else {
            return .failure(RestoreError("not JSON"))
        }
        return restore(parsed).mapError { RestoreError("not a consent snapshot (\($0.reason))") }
    }

    /// What the host uses when the consent file exists but cannot be read or understood: the
    /// master switch denied until an operator sets consent again (granting by accident is the
    /// worse error).
    public static var failedClosed: ConsentStore {
        var s = ConsentStore()
        s.set(master, granted: false)
        return s
    }

    public struct RestoreError: Error, Equatable, Sendable {
        public let reason: String
        init(_ r: String) { reason = r }
    }
}
