import PylonCore

/// The device facts macros read (`_l`, `_ov`, `_an`, ...). Injected: on Linux the plugin fills
/// it from the system (`uname`, `LANG`) and the calling app's params; tests pass their own.
public struct TagEnvironment: Sendable, Equatable {
    public var language = ""
    public var osVersion = ""
    public var appName = ""
    public var appVersion = ""
    public var appId = ""
    public var platform = "linux"
    public var deviceName = ""
    public var deviceType = ""
    public var resolution = ""
    public var sdkVersion = ""
    public var runtimeVersion = ""

    public init() {}

    /// Overrides from a request's params (`app: {name, version, id}`, `language`,
    /// `resolution`, `deviceType`): the calling app knows these, the daemon does not.
    public func overridden(by params: JSON) -> TagEnvironment {
        var e = self
        if let app = params["app"] {
            if let s = app["name"]?.stringValue { e.appName = s }
            if let s = app["version"]?.stringValue { e.appVersion = s }
            if let s = app["id"]?.stringValue { e.appId = s }
        }
        if let s = params["language"]?.stringValue { e.language = s }
        if let s = params["resolution"]?.stringValue { e.resolution = s }
        if let s = params["deviceType"]?.stringValue { e.deviceType = s }
        return e
    }
}

/// A function-call macro invocation the engine needs an answer for: the handler registered for
/// `name` is called with `parameters`.
public struct FunctionCallRequest: Hashable, Sendable {
    public let name: String
    public let parameters: JSON
    /// Identifies the call within one evaluation round (name + serialized parameters).
    public var key: String { name + "\u{1}" + parameters.serialized }
    public static func == (a: Self, b: Self) -> Bool { a.key == b.key }
    public func hash(into h: inout Hasher) { h.combine(key) }
}

/// What one evaluation may read.
public struct EvaluationContext: Sendable {
    public var environment: TagEnvironment
    public var dataLayer: DataLayer
    /// The current event's name during tag evaluation (`_e`), else nil.
    public var event: String?
    public var nowMs: Int64
    /// Seeds `_r` (deterministic under test).
    public var seed: UInt64
    /// Function-call macro names that have a handler.
    public var registeredMacros: Set<String>
    /// Answers already obtained, by `FunctionCallRequest.key`; `.null` means the handler
    /// failed or did not answer (the type default is used).
    public var functionResults: [String: JSON]

    public init(
        environment: TagEnvironment = TagEnvironment(), dataLayer: DataLayer = DataLayer(), event: String? = nil,
        nowMs: Int64 = 0, seed: UInt64 = 0, registeredMacros: Set<String> = [], functionResults: [String: JSON] = [:]
    ) {
        self.environment = environment
        self.dataLayer = dataLayer
        self.event = event
        self.nowMs = nowMs
        self.seed = seed
        self.registeredMacros = registeredMacros
        self.functionResults = functionResults
    }
}

/// The result of evaluating a value: `value` nil means unresolved (the caller converts it to
/// the type default). `pending` lists function-call macros whose handlers must be asked
/// before the value is final (re-evaluate with their answers in `functionResults`).
public struct Evaluation: Sendable {
    public var value: JSON?
    public var warnings: [String]
    public var pending: [FunctionCallRequest]
    /// Set when a limit stopped the evaluation: `value` is then nil (callers answer an error).
    public var stop: EvaluationStop? = nil

    /// The value converted to `type` (the type default when unresolved).
    public func converted(to type: ValueType) -> (value: JSON, warning: String?) {
        var w: String?
        let v = TagConversion.convert(value, to: type) { w = $0 }
        return (v, w)
    }
}

/// A tag that fires for an event, with its properties evaluated.
public struct TagFiring: Sendable, Equatable {
    public let index: Int
    public let function: FunctionID
    public let functionId: String
    /// Every property of the tag, evaluated (unresolved → null).
    public let properties: JSONObject
}

public struct TagEvaluation: Sendable {
    public var tags: [TagFiring]
    public var warnings: [String]
    public var pending: [FunctionCallRequest]
    /// Set when a limit stopped the evaluation: `tags` is then empty (nothing fires half-evaluated).
    public var stop: EvaluationStop? = nil
}

/// Why an evaluation stopped before its end.
public enum EvaluationStop: Sendable, Equatable {
    /// `EngineLimits.maxSteps` work units.
    case steps
    /// `EngineLimits.maxWorkBytes` bytes produced and hashed.
    case workBytes
    /// The value's JSON text is larger than `EngineLimits.maxValueBytes`.
    case valueBytes

    /// The limit's name in the gtm plugin's config (and in its error's `data.limit`).
    public var limitName: String {
        switch self {
        case .steps: return "maxEvaluationSteps"
        case .workBytes: return "maxEvaluationBytes"
        case .valueBytes: return "maxValueBytes"
        }
    }
}
