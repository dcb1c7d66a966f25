/// A strict reader of a plugin's `config` object (`plugins[NAME].config` in pylon.json): every
/// setting is read with its type and bounds, and a value of the wrong type or out of bounds is a
/// problem named by its path (`config.retryMaxMs: must be an integer from 0 to 86400000`), never
/// silently replaced by the default. Settings the reader was not asked for are reported as
/// unknown: a warning at start, an error under `--check-config` (a typo must not pass the check).
///
/// The same reader serves the plugin at start (it exits 78, EX_CONFIG, on a problem) and
/// `pylond --check-config`, which runs `PLUGIN --check-config` with the config on stdin
/// (`Plugin.checkConfig`), so the check is exactly what the plugin will do. It is also the host's
/// reader of pylon.json (`HostConfig.parse`, where an unknown key is always an error): one reader
/// of configuration for the host and every plugin.
public struct ConfigReader {
    public private(set) var problems: [String] = []
    let object: JSONObject
    let path: String
    private var asked: Set<String> = []

    /// `path` names the object in problems (`config`, `limits`, `plugins[2]`; empty: the file's
    /// top level, whose settings are named alone).
    public init(_ json: JSON, path: String = "config") {
        self.path = path
        if let o = json.objectValue {
            object = o
        } else {
            object = [:]
            if json != .null { problems.append("\(path): must be an object") }
        }
    }

    /// The value at `key` unless absent or `null` (both mean "the default").
    private mutating func value(_ key: String) -> JSON? {
        asked.insert(key)
        guard let v = object[key], v != .null else { return nil }
        return v
    }

    private mutating func problem(_ key: String, _ what: String) {
        problems.append("\(name(key)): \(what)")
    }

    /// A setting's full name: `path.key`, or `key` at the top level.
    public func name(_ key: String) -> String { path.isEmpty ? key : "\(path).\(key)" }

    /// Whether `key` is present and not `null` (marking it read).
    public mutating func has(_ key: String) -> Bool { value(key) != nil }

    public mutating func string(_ key: String, nonEmpty: Bool = true) -> String? {
        guard let v = value(key) else { return nil }
        guard let s = v.stringValue, !nonEmpty || !s.isEmpty else {
            problem(key, nonEmpty ? "must be a non-empty string" : "must be a string")
            return nil
        }
        return s
    }

    /// An integer within `range`; whole-valued numbers such as `5.0` count as integers.
    public mutating func int(_ key: String, _ range: ClosedRange<Int64>) -> Int64? {
        guard let v = value(key) else { return nil }
        guard let n = v.intValue, range.contains(n), v.boolValue == nil else {
            problem(key, "must be an integer from \(range.lowerBound) to \(range.upperBound)")
            return nil
        }
        return n
    }

    /// An integer of at least `lo` (and at most `hi`), for settings bounded on one side.
    public mutating func int(_ key: String, atLeast lo: Int64, atMost hi: Int64 = .max) -> Int64? {
        guard let v = value(key) else { return nil }
        guard let n = v.intValue, n >= lo, n <= hi, v.boolValue == nil else {
            problem(key, "must be an integer >= \(lo)" + (hi < .max ? " and <= \(hi)" : "") + ", not \(v.serialized)")
            return nil
        }
        return n
    }

    public mutating func double(_ key: String) -> Double? {
        guard let v = value(key) else { return nil }
        guard let d = v.doubleValue, v.boolValue == nil else {
            problem(key, "must be a number, not \(v.serialized)")
            return nil
        }
        return d
    }

    public mutating func array(_ key: String) -> [JSON]? {
        guard let v = value(key) else { return nil }
        guard let a = v.arrayValue else {
            problem(key, "must be an array")
            return nil
        }
        return a
    }

    /// An array of strings (absent: empty).
    public mutating func stringArray(_ key: String) -> [String] {
        guard let a = array(key) else { return [] }
        let out = a.compactMap(\.stringValue)
        guard out.count == a.count else {
            problem(key, "must be an array of strings")
            return []
        }
        return out
    }

    /// An array of non-negative integers (absent: empty).
    public mutating func intArray(_ key: String) -> [Int64] {
        guard let a = array(key) else { return [] }
        let out = a.compactMap { $0.boolValue == nil ? $0.intValue : nil }.filter { $0 >= 0 }
        guard out.count == a.count else {
            problem(key, "must be an array of non-negative integers")
            return []
        }
        return out
    }

    public mutating func bool(_ key: String) -> Bool? {
        guard let v = value(key) else { return nil }
        guard let b = v.boolValue else {
            problem(key, "must be true or false")
            return nil
        }
        return b
    }

    public mutating func object(_ key: String) -> JSONObject? {
        guard let v = value(key) else { return nil }
        guard let o = v.objectValue else {
            problem(key, "must be an object")
            return nil
        }
        return o
    }

    /// One of `choices` (a string).
    public mutating func choice(_ key: String, _ choices: [String]) -> String? {
        guard let v = value(key) else { return nil }
        guard let s = v.stringValue, choices.contains(s) else {
            problem(key, "must be one of " + choices.map { "\"\($0)\"" }.joined(separator: ", "))
            return nil
        }
        return s
    }

    /// An `http://` or `https://` URL with a host and no credentials or spaces.
    public mutating func httpURL(_ key: String) -> String? {
        guard let s = string(key) else { return nil }
        if let why = ConfigReader.httpURLProblem(s) {
            problem(key, why)
            return nil
        }
        return s
    }

    /// Why `s` is not an acceptable backend URL, or nil.
    public static func httpURLProblem(_ s: String) -> String? {
        guard let sep = s.range(of: "://") else { return "\(s) is not a URL (http:// or https://)" }
        let scheme = s[..<sep.lowerBound].lowercased()
        guard scheme == "http" || scheme == "https" else { return "scheme \(scheme) is not allowed (only http and https)" }
        guard s.utf8.allSatisfy({ $0 > 0x20 && $0 != 0x7F }) else { return "contains spaces or control characters" }
        let authority = s[sep.upperBound...].prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard !authority.contains("@") else { return "credentials in the URL are not supported" }
        guard !authority.isEmpty, !authority.hasPrefix(":") else { return "\(s) has no host" }
        return nil
    }

    /// Marks `keys` as read elsewhere (not unknown).
    public mutating func accept(_ keys: String...) {
        for k in keys { asked.insert(k) }
    }

    /// Adds `problem` found by the plugin's own checks (cross-setting rules), under `key`.
    public mutating func fail(_ key: String, _ what: String) { problem(key, what) }

    /// Settings present that no one asked for (`config.fo: unknown setting`): a warning when the
    /// plugin starts (the setting is ignored), an error under `--check-config`
    /// (`Plugin.checkConfigAndExit`). Keys starting with `_` or `//` are comments, as in the
    /// host's file.
    public var unknown: [String] {
        object.keys.filter { !asked.contains($0) && !$0.hasPrefix("_") && !$0.hasPrefix("//") }.sorted().map {
            "\(name($0)): unknown setting"
        }
    }

    /// Throws the problems found so far, if any.
    public func check() throws(ConfigProblems) {
        if !problems.isEmpty { throw ConfigProblems(problems: problems, warnings: unknown) }
    }
}

/// What a strict config reader found: errors (the plugin refuses to start) and warnings.
public struct ConfigProblems: Error, CustomStringConvertible {
    public var problems: [String]
    public var warnings: [String] = []
    public init(problems: [String], warnings: [String] = []) {
        self.problems = problems
        self.warnings = warnings
    }
    public init(_ problem: String) { problems = [problem] }
    public var description: String { problems.joined(separator: "; ") }
}
